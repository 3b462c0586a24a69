package chaos.orders;

import java.util.Map;
import java.util.UUID;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.context.annotation.Profile;
import org.springframework.dao.DataAccessException;
import org.springframework.http.ResponseEntity;
import org.springframework.transaction.TransactionException;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * POST /orders {order_id, sku, quantity}: 201 placed, 200 the same order again,
 * 409 the same id with other contents, 400 a bad body, 503 a database error (as
 * examples/orders/service.py). GET /health: 200 once the context is up.
 */
@RestController
@Profile("service")
class OrderController {

	private static final Logger log = LoggerFactory.getLogger(OrderController.class);
	private final OrderService orders;

	OrderController(OrderService orders) {
		this.orders = orders;
	}

	@GetMapping("/health")
	Map<String, String> health() {
		return Map.of("status", "ok");
	}

	@PostMapping("/orders")
	ResponseEntity<Map<String, Object>> place(@RequestBody Map<String, Object> body) {
		UUID orderId;
		String sku;
		int quantity;
		try {
			orderId = UUID.fromString(String.valueOf(body.get("order_id")));
			sku = (String) body.get("sku");
			quantity = Integer.parseInt(String.valueOf(body.get("quantity")));
			if (sku == null || sku.isEmpty() || quantity <= 0) {
				throw new IllegalArgumentException("sku and a positive quantity are required");
			}
		} catch (RuntimeException e) {
			return ResponseEntity.badRequest().body(Map.of("error", String.valueOf(e.getMessage())));
		}
		return switch (orders.place(orderId, sku, quantity)) {
			case PLACED -> ResponseEntity.status(201).body(Map.of("order_id", orderId.toString()));
			case SAME -> ResponseEntity.ok(Map.of("order_id", orderId.toString()));
			case CONFLICT -> ResponseEntity.status(409).body(Map.of("error", "order_id exists with other contents"));
		};
	}

	@ExceptionHandler({ DataAccessException.class, TransactionException.class })
	ResponseEntity<Map<String, Object>> database(Exception e) {
		log.warn("database error: {}", e.toString());
		return ResponseEntity.status(503).body(Map.of("error", "database unavailable"));
	}
}
