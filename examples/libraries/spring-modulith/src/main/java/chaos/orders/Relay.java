package chaos.orders;

import java.time.Duration;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Profile;
import org.springframework.modulith.events.IncompleteEventPublications;
import org.springframework.scheduling.annotation.EnableScheduling;
import org.springframework.scheduling.annotation.Scheduled;

/**
 * The relay: Spring Modulith's documented way to finish publications an
 * externalization left incomplete (the service killed after its commit, a send
 * that failed, an acknowledgement lost): IncompleteEventPublications'
 * resubmitIncompletePublicationsOlderThan, on a schedule, from a process of its
 * own. A resubmitted publication is externalized again from here, and marked
 * completed (completion_date) once Kafka acknowledged it.
 *
 * --chaos.no-resubmit=true: THE BUG of broken-no-resubmit.toml: nothing resubmits, as an
 * application that relies on the externalization after commit alone.
 */
@Configuration
@Profile("relay")
@EnableScheduling
class Relay {

	private static final Logger log = LoggerFactory.getLogger(Relay.class);
	private final IncompleteEventPublications incomplete;
	private final boolean noResubmit;
	private final Duration olderThan;

	Relay(IncompleteEventPublications incomplete, @Value("${chaos.no-resubmit:false}") boolean noResubmit,
			@Value("${chaos.resubmit-older-than:10s}") Duration olderThan) {
		this.incomplete = incomplete;
		this.noResubmit = noResubmit;
		this.olderThan = olderThan;
	}

	@Scheduled(fixedDelayString = "${chaos.resubmit-every:2s}", initialDelay = 1000)
	void resubmit() {
		if (noResubmit) {
			return;
		}
		try {
			incomplete.resubmitIncompletePublicationsOlderThan(olderThan);
		} catch (RuntimeException e) {
			log.warn("resubmission failed: {}", e.toString());
		}
	}
}
