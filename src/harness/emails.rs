//! The email provider of one run: started before the components when the
//! notifier sends its receipts as emails, struck by the run's fault
//! injector, and read by the verifier after the drain. Its record is
//! ground truth the system under test cannot touch.

use crate::error::{Error, Result};
use crate::faults::{FaultInjector, FaultPoint};
use crate::provider::client::{EmailClient, TIMEOUT};
use crate::provider::{Fault, Nemesis, Provider, ProviderSettings};
use crate::scenario::{EmailMode, Scenario};
use std::sync::Arc;

/// The provider's faults, decided by the run's seeded injector, so that a
/// run's firings are logged, attributed and replayed like every other.
struct Strikes(Arc<FaultInjector>);

fn point(f: Fault) -> FaultPoint {
    match f {
        Fault::ResponseLost => FaultPoint::ProviderResponseLost,
        Fault::Error => FaultPoint::ProviderError,
        Fault::Slow => FaultPoint::ProviderSlow,
    }
}

impl Nemesis for Strikes {
    fn decide(&self, key: Option<&str>) -> Option<Fault> {
        let what = || match key {
            Some(k) => format!("an email with key {k}"),
            None => "an email without a key".into(),
        };
        // One fault at most per request: the first that fires.
        [Fault::ResponseLost, Fault::Error, Fault::Slow]
            .into_iter()
            .find(|f| self.0.strike(point(*f), "provider", what))
    }

    fn confirmed(&self, fault: Fault) {
        self.0.confirm(point(fault), 1);
    }
}

/// Starts the run's provider when its notifier sends emails.
pub async fn start(sc: &Scenario, faults: &Arc<FaultInjector>) -> Result<Option<Provider>> {
    let declared = sc.system.as_ref().is_some_and(|s| s.uses_provider());
    if sc.notifier.email == EmailMode::Off && !declared {
        return Ok(None);
    }
    // The record keeps the fields the verifier reads: the receipts' and
    // those a declared system's effects name.
    let mut settings = ProviderSettings::default();
    for field in sc.system.as_ref().map(|s| s.provider_fields()).unwrap_or_default() {
        if !settings.keep.contains(&field) {
            settings.keep.push(field);
        }
    }
    let p = Provider::start(settings, Arc::new(Strikes(faults.clone()))).await?;
    tracing::info!(url = %p.base_url(), "email provider listening");
    Ok(Some(p))
}

/// The reference notifier's client for the provider at `url`.
pub fn client(url: &str) -> Result<EmailClient> {
    EmailClient::new(url, TIMEOUT).map_err(|e| Error::Internal(format!("the email client for {url}: {e}")))
}
