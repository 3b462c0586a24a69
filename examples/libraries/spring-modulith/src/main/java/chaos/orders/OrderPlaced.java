package chaos.orders;

import java.util.UUID;

import org.springframework.modulith.events.Externalized;

/**
 * The event each order publishes, with an id of its own: the registry keys its
 * rows by a publication id the externalized message never carries, so the
 * event's id travels in the event (and as the message's event_id header).
 * Serialized as JSON twice by the library, with the same Jackson mapper: into
 * event_publication.serialized_event, and as the Kafka message's value.
 */
@Externalized
public record OrderPlaced(UUID eventId, UUID orderId, String sku, int quantity) {}
