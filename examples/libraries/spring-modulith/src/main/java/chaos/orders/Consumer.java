package chaos.orders;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.UUID;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.kafka.autoconfigure.ConcurrentKafkaListenerContainerFactoryConfigurer;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Profile;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.listener.ContainerProperties.AckMode;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.support.Acknowledgment;
import org.springframework.transaction.support.TransactionTemplate;
import org.springframework.util.backoff.FixedBackOff;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * The consumer: a Spring Kafka batch @KafkaListener in CHAOS_GROUP (static
 * member CHAOS_INSTANCE) that applies each OrderPlaced once. For each poll (up to
 * CHAOS_BATCH_SIZE records), in ONE transaction, each message's event_id is
 * claimed in processed_messages (INSERT ... ON CONFLICT DO NOTHING) and, only if
 * the claim is new, the order shipped and its quantity taken off the stock. The
 * offsets are committed after that transaction (AckMode.MANUAL_IMMEDIATE,
 * Acknowledgment.acknowledge() once it committed);
 * on an error the container seeks back and retries every second, for ever (the
 * default error handler gives up after 10 quick attempts and skips the record).
 *
 * --chaos.no-dedup=true: THE BUG of broken-no-dedup.toml: no claim, every delivery applied.
 * --chaos.ack-first=true: THE BUG of broken-ack-first.toml: the offset committed
 * (Acknowledgment.acknowledge(), AckMode.MANUAL_IMMEDIATE) before the message is applied.
 */
@Configuration
@Profile("consumer")
class Consumer {

	private final JdbcTemplate jdbc;
	private final TransactionTemplate tx;
	private final boolean noDedup;
	private final boolean ackFirst;
	private final JsonMapper json = new JsonMapper();
	private static final org.slf4j.Logger log = org.slf4j.LoggerFactory.getLogger(Consumer.class);

	Consumer(JdbcTemplate jdbc, TransactionTemplate tx, @Value("${chaos.no-dedup:false}") boolean noDedup,
			@Value("${chaos.ack-first:false}") boolean ackFirst) {
		this.jdbc = jdbc;
		this.tx = tx;
		this.noDedup = noDedup;
		this.ackFirst = ackFirst;
	}

	@Bean
	ConcurrentKafkaListenerContainerFactory<Object, Object> kafkaListenerContainerFactory(
			ConcurrentKafkaListenerContainerFactoryConfigurer configurer, ConsumerFactory<Object, Object> consumers) {
		var factory = new ConcurrentKafkaListenerContainerFactory<Object, Object>();
		configurer.configure(factory, consumers);
		factory.setBatchListener(true);
		factory.getContainerProperties().setAckMode(AckMode.MANUAL_IMMEDIATE);
		factory.setCommonErrorHandler(new DefaultErrorHandler(new FixedBackOff(1000L, FixedBackOff.UNLIMITED_ATTEMPTS)));
		return factory;
	}

	@KafkaListener(id = "orders", idIsGroup = false, topics = "${chaos.topic}")
	void onMessages(List<ConsumerRecord<String, String>> records, Acknowledgment ack) {
		if (ackFirst) {
			ack.acknowledge();
		}
		try {
			tx.executeWithoutResult(s -> records.forEach(this::apply));
		} catch (RuntimeException e) {
			log.warn("{} records from offset {}-{} not applied: {}", records.size(), records.get(0).partition(),
					records.get(0).offset(), e.toString());
			throw e;
		}
		if (!ackFirst) {
			ack.acknowledge();
		}
	}

	/** One message, inside the batch's transaction. */
	private void apply(ConsumerRecord<String, String> record) {
		UUID eventId = UUID.fromString(header(record, "event_id"));
		JsonNode event = json.readTree(record.value());
		UUID orderId = UUID.fromString(event.get("orderId").asString());
		String sku = event.get("sku").asString();
		int quantity = event.get("quantity").asInt();
		if (!noDedup && jdbc.update(
				"INSERT INTO processed_messages (message_id) VALUES (?) ON CONFLICT DO NOTHING", eventId) == 0) {
			return; // handled before: a duplicate or a redelivery
		}
		jdbc.update("INSERT INTO shipments (order_id, message_id) VALUES (?, ?)", orderId, eventId);
		jdbc.update("UPDATE stock SET on_hand = on_hand - ? WHERE sku = ?", quantity, sku);
	}

	private static String header(ConsumerRecord<?, ?> record, String name) {
		Header header = record.headers().lastHeader(name);
		if (header == null) {
			throw new IllegalArgumentException("no " + name + " header");
		}
		return new String(header.value(), StandardCharsets.UTF_8);
	}
}
