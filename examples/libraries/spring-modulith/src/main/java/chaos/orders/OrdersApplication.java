package chaos.orders;

import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.SpringBootApplication;

/**
 * One jar, three roles, picked by the first argument (a Spring profile):
 *
 * <ul>
 * <li>{@code service}: POST /orders, GET /health. The order and its {@link OrderPlaced}
 * event in one transaction; Spring Modulith's event publication registry
 * ({@code event_publication}) is the outbox, and its Kafka externalization sends
 * the event after the commit, from this process.</li>
 * <li>{@code relay}: no HTTP. Every 2 s it resubmits the publications the registry
 * still has incomplete after 10 s ({@code IncompleteEventPublications}), which
 * externalizes them again from here.</li>
 * <li>{@code consumer}: a Spring Kafka listener that applies each message once.</li>
 * </ul>
 *
 * chaos's environment (docs/contract.md section 2) becomes Spring properties here:
 * CHAOS_DATABASE_URL (a libpq URL) becomes a JDBC URL with currentSchema =
 * CHAOS_SCHEMA and ApplicationName = PGAPPNAME; CHAOS_BROKERS, CHAOS_TOPIC,
 * CHAOS_GROUP, CHAOS_INSTANCE (static membership), CHAOS_SESSION_TIMEOUT_MS and
 * CHAOS_PORT are read by application.properties.
 */
@SpringBootApplication
public class OrdersApplication {

	public static void main(String[] args) {
		if (args.length == 0 || !java.util.Set.of("service", "relay", "consumer").contains(args[0])) {
			System.err.println("usage: modulith-orders service|relay|consumer [--chaos.two-transactions=true|--chaos.no-resubmit=true|--chaos.no-dedup=true|--chaos.ack-first=true]");
			System.exit(2);
		}
		String role = args[0];
		var app = new SpringApplication(OrdersApplication.class);
		app.setAdditionalProfiles(role);
		app.setWebApplicationType(role.equals("service") ? WebApplicationType.SERVLET : WebApplicationType.NONE);
		app.setDefaultProperties(database());
		app.run(args);
	}

	/** CHAOS_DATABASE_URL (postgres://user:password@host:port/db) as Spring's datasource properties. */
	static Map<String, Object> database() {
		var url = URI.create(env("CHAOS_DATABASE_URL", "postgres://chaos:chaos@127.0.0.1:5432/chaos"));
		var props = new HashMap<String, Object>();
		var userInfo = url.getRawUserInfo() == null ? "" : url.getRawUserInfo();
		var parts = userInfo.split(":", 2);
		props.put("spring.datasource.username", URLDecoder.decode(parts[0], StandardCharsets.UTF_8));
		props.put("spring.datasource.password", parts.length > 1 ? URLDecoder.decode(parts[1], StandardCharsets.UTF_8) : "");
		var jdbc = "jdbc:postgresql://" + url.getHost() + ":" + (url.getPort() > 0 ? url.getPort() : 5432) + url.getPath()
				+ "?sslmode=disable&currentSchema=" + env("CHAOS_SCHEMA", "public")
				+ "&ApplicationName=" + env("PGAPPNAME", "modulith-orders");
		props.put("spring.datasource.url", jdbc);
		return props;
	}

	static String env(String name, String fallback) {
		var value = System.getenv(name);
		return value == null || value.isEmpty() ? fallback : value;
	}
}
