package chaos.orders;

import java.util.List;
import java.util.UUID;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.ApplicationEventPublisher;
import org.springframework.context.annotation.Profile;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * The order and its event in ONE transaction, as Spring Modulith's "Working with
 * Application Events" asks: publishEvent(...) inside the transaction stores the
 * event publication (event_publication) with the order; the externalizer sends
 * it to Kafka after the commit and marks it completed once Kafka acknowledged.
 *
 * --chaos.two-transactions=true: THE BUG of broken-two-transactions.toml: the order is
 * committed first, the event published in a second transaction.
 */
@Service
@Profile("service")
class OrderService {

	enum Outcome { PLACED, SAME, CONFLICT }

	private final JdbcTemplate jdbc;
	private final ApplicationEventPublisher events;
	private final TransactionTemplate tx;
	private final boolean twoTransactions;

	OrderService(JdbcTemplate jdbc, ApplicationEventPublisher events, TransactionTemplate tx,
			@Value("${chaos.two-transactions:false}") boolean twoTransactions) {
		this.jdbc = jdbc;
		this.events = events;
		this.tx = tx;
		this.twoTransactions = twoTransactions;
	}

	Outcome place(UUID orderId, String sku, int quantity) {
		if (twoTransactions) {
			Outcome outcome = tx.execute(s -> insert(orderId, sku, quantity));
			if (outcome == Outcome.PLACED) {
				tx.executeWithoutResult(s -> events.publishEvent(new OrderPlaced(UUID.randomUUID(), orderId, sku, quantity)));
			}
			return outcome;
		}
		return tx.execute(s -> {
			Outcome outcome = insert(orderId, sku, quantity);
			if (outcome == Outcome.PLACED) {
				events.publishEvent(new OrderPlaced(UUID.randomUUID(), orderId, sku, quantity));
			}
			return outcome;
		});
	}

	private Outcome insert(UUID orderId, String sku, int quantity) {
		int inserted = jdbc.update(
				"INSERT INTO orders (order_id, sku, quantity) VALUES (?, ?, ?) ON CONFLICT (order_id) DO NOTHING",
				orderId, sku, quantity);
		if (inserted == 1) {
			return Outcome.PLACED;
		}
		List<Boolean> same = jdbc.query("SELECT sku = ? AND quantity = ? FROM orders WHERE order_id = ?",
				(rs, i) -> rs.getBoolean(1), sku, quantity, orderId);
		return !same.isEmpty() && same.get(0) ? Outcome.SAME : Outcome.CONFLICT;
	}
}
