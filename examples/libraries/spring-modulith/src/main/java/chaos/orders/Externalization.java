package chaos.orders;

import java.nio.charset.StandardCharsets;
import java.util.Map;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.modulith.events.EventExternalizationConfiguration;
import org.springframework.modulith.events.RoutingTarget;

/**
 * Spring Modulith's externalization, configured as its reference documentation's
 * "Fundamentals of Event Externalization" shows (the API form of
 * {@code @Externalized("topic::#{orderId()}")}): the topic is chaos's run topic,
 * so it is set here and not in the annotation; the key is the order id; the
 * headers event_id and event_type are given as bytes (Spring Kafka's header
 * mapper passes byte[] through as is).
 */
@Configuration
class Externalization {

	@Bean
	EventExternalizationConfiguration eventExternalizationConfiguration(@Value("${chaos.topic}") String topic) {
		return EventExternalizationConfiguration.externalizing()
				.select(EventExternalizationConfiguration.annotatedAsExternalized())
				.headers(OrderPlaced.class, it -> Map.of(
						"event_id", it.eventId().toString().getBytes(StandardCharsets.UTF_8),
						"event_type", "OrderPlaced".getBytes(StandardCharsets.UTF_8)))
				.route(OrderPlaced.class, it -> RoutingTarget.forTarget(topic).andKey(it.orderId().toString()))
				.build();
	}
}
