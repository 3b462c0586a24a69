//! The embedded mode's broker: librdkafka's own mock cluster, in process.
//! It speaks the real Kafka protocol to the same rdkafka producers and
//! consumers the real broker gets, so the Kafka adapter serves both.

use crate::error::{Error, Result};
use rdkafka::bindings;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use std::ffi::{CStr, CString};

/// A one-broker mock cluster, alive as long as this value.
pub struct MockCluster {
    /// The client that owns the mock cluster (created by `test.mock.num.brokers`).
    holder: Option<BaseProducer>,
    /// The mock cluster handle, as an address: valid while `holder` lives.
    cluster: usize,
    /// `host:port` the mock listens on, for every other client of the run.
    pub bootstrap: String,
}

impl MockCluster {
    pub fn start() -> Result<Self> {
        let holder: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .set("log_level", "3")
            .create()
            .map_err(|e| Error::kafka("starting the embedded mock cluster", e))?;
        // SAFETY: the pointer comes from a live client, which `self` keeps
        // alive for as long as the mock cluster is used.
        let (cluster, bootstrap) = unsafe {
            let mc = bindings::rd_kafka_handle_mock_cluster(holder.client().native_ptr());
            if mc.is_null() {
                return Err(Error::Internal("librdkafka did not create a mock cluster".into()));
            }
            // The mock waits 3 s before the first rebalance of a group by
            // default; our own Kafka is configured with 0, and so is this.
            bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(mc, 0);
            (mc as usize, CStr::from_ptr(bindings::rd_kafka_mock_cluster_bootstraps(mc)).to_string_lossy().into_owned())
        };
        Ok(Self { holder: Some(holder), cluster, bootstrap })
    }

    /// Creates a topic. The mock answers no CreateTopics request, so the
    /// topic is made through the mock's own API.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        let name =
            CString::new(topic).map_err(|_| Error::Usage(format!("topic name {topic:?} contains a NUL byte")))?;
        // SAFETY: `cluster` is valid while `holder` is alive, which `&self` guarantees.
        let code = unsafe {
            bindings::rd_kafka_mock_topic_create(
                self.cluster as *mut bindings::rd_kafka_mock_cluster_t,
                name.as_ptr(),
                partitions,
                1,
            )
        };
        if code != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(Error::Kafka {
                context: format!("creating topic {topic} on the mock cluster"),
                cause: format!("{code:?}"),
            });
        }
        Ok(())
    }

    /// Its one broker down, up, or slow: true when the mock took it.
    pub fn outage(&self, what: crate::broker::Outage) -> bool {
        let mc = self.cluster as *mut bindings::rd_kafka_mock_cluster_t;
        // SAFETY: `cluster` is valid while `holder` is alive, which `&self`
        // guarantees; broker 1 is the mock's only broker.
        let code = unsafe {
            match what {
                crate::broker::Outage::Down => bindings::rd_kafka_mock_broker_set_down(mc, 1),
                crate::broker::Outage::Up => bindings::rd_kafka_mock_broker_set_up(mc, 1),
                crate::broker::Outage::RoundTrip(d) => {
                    bindings::rd_kafka_mock_broker_set_rtt(mc, 1, d.as_millis() as i32)
                }
            }
        };
        code == bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    }

    /// Stops the mock cluster off the async threads (its destruction blocks).
    pub async fn stop(mut self) {
        if let Some(h) = self.holder.take() {
            let _ = tokio::task::spawn_blocking(move || drop(h)).await;
        }
    }
}
