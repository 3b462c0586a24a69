//! The system under test, one seam with two kinds behind it: the
//! reference payments pipeline (in process, or with a program under test
//! as processes), and a declared system (the user's service, relays and
//! consumers as processes). The run's skeleton (`super::execute_keeping`)
//! asks each the same questions in the same order.

use super::declared::Declared;
use super::drive::Ran;
use super::history::History;
use super::infra::Infra;
use super::reference::{self, Reference};
use super::series::FromBroker;
use crate::context::{Ctx, Named};
use crate::domain::names::RunNames;
use crate::error::Result;
use crate::harness::infra::Endpoints;
use crate::nemesis::acting::Acting;
use crate::nemesis::process::program::Programs;
use crate::nemesis::proxy::Lanes;
use crate::provider::Record;
use crate::report::progress::Progress;
use crate::report::Report;
use crate::scenario::Scenario;
use std::path::Path;

/// Each kind boxed: the skeleton moves one of them, of about 1 KB.
pub(super) enum SystemUnderTest {
    Reference(Box<Reference>),
    Declared(Box<Declared>),
}

impl SystemUnderTest {
    /// The run's names: a declared system's schema is named for it.
    pub fn names(sc: &Scenario) -> RunNames {
        match &sc.system {
            Some(_) => RunNames::new().for_system(&sc.name),
            None => RunNames::new(),
        }
    }

    /// The run's database and broker, opened and made ready for the system:
    /// a declared system replaces the payments pipeline whole.
    pub async fn open(
        sc: &Scenario,
        endpoints: &Endpoints,
        names: &RunNames,
        reports_dir: &Path,
    ) -> Result<(Self, Infra)> {
        match &sc.system {
            Some(sys) => {
                let (d, infra) = Declared::open(sc, sys, endpoints, names).await?;
                Ok((Self::Declared(Box::new(d)), infra))
            }
            None => {
                let (r, infra) = Reference::open(sc, endpoints, names, reports_dir).await?;
                Ok((Self::Reference(Box::new(r)), infra))
            }
        }
    }

    /// How many operations the workload sends: the progress line's total.
    pub fn operations(&self, sc: &Scenario) -> u64 {
        match self {
            Self::Reference(_) => sc.payments,
            Self::Declared(d) => d.operations(),
        }
    }

    /// What one operation is called on the progress line.
    pub fn unit(&self) -> &'static str {
        match self {
            Self::Reference(_) => "payments",
            Self::Declared(_) => "operations",
        }
    }

    /// Starts the system's components and programs, each a named task.
    pub async fn start(
        &mut self,
        ctx: &Ctx,
        endpoints: &Endpoints,
        reports_dir: &Path,
        lanes: Option<&Lanes>,
    ) -> Result<Vec<Named>> {
        match self {
            Self::Reference(r) => r.start(ctx, endpoints.database_url.as_deref(), reports_dir, lanes).await,
            Self::Declared(d) => d.start(ctx, reports_dir, lanes),
        }
    }

    /// The workload, then the drain. An error is a system that could not
    /// be run at all (a service that never answered). A program that said
    /// it lacks something is the run's one error, whatever wait it cut
    /// short (a service's health, the group's).
    pub async fn drive(&mut self, ctx: &Ctx, acting: &Acting, progress: &Progress) -> Result<Ran> {
        let ran = match self {
            Self::Reference(r) => r.drive(ctx, acting, progress).await,
            Self::Declared(d) => d.drive(ctx, acting, progress).await,
        };
        match self.lacking() {
            Some(why) => Err(crate::Error::Service(why)),
            None => ran,
        }
    }

    fn programs(&self) -> Option<&Programs> {
        match self {
            Self::Reference(r) => r.programs(),
            Self::Declared(d) => d.programs(),
        }
    }

    /// The first failure of a program under test, if one failed.
    pub fn failure(&self) -> Option<String> {
        self.programs().and_then(|p| p.failure())
    }

    /// What a program under test said it lacks (status 3 before the run
    /// acted): the run then ends as one whose database is unreachable.
    pub fn lacking(&self) -> Option<String> {
        self.programs().and_then(|p| p.lacking())
    }

    /// The checkers' pass over what the run recorded, and the verdict.
    pub async fn judge(&self, rep: &mut Report, ctx: &Ctx, ran: &mut Ran, history: History) {
        match self {
            Self::Reference(_) => reference::judge(rep, ctx, ran, history).await,
            Self::Declared(d) => d.judge(rep, ctx, ran, history).await,
        }
    }

    /// What the run recorded, taken once, now that every component has
    /// stopped: the checkers read it ([`History`]).
    pub fn history(&mut self, ctx: &Ctx, provider: Option<Record>, still_running: bool) -> History {
        let (intent, operations) = match self {
            Self::Reference(_) => (ctx.intent.take(), vec![]),
            Self::Declared(d) => (vec![], d.take_operations()),
        };
        History {
            intent,
            operations,
            faults: ctx.faults.history(),
            summary: ctx.faults.summary(),
            provider,
            still_running,
        }
    }

    /// The series' figures the system's components do not count for the
    /// harness, read from the broker instead: a declared system's programs
    /// count nothing, and in the payments pipeline a program under test
    /// (`relay.command`, `notifier.command`) counts nothing for its role.
    pub fn from_broker(&self, ctx: &Ctx) -> Option<FromBroker> {
        let sc = &ctx.scenario;
        match self {
            Self::Declared(_) => FromBroker::of(ctx, true, true),
            Self::Reference(_) => FromBroker::of(ctx, sc.relay.command.is_some(), sc.notifier.command.is_some()),
        }
    }

    /// What the report's scenario section says of the system's shape.
    pub fn shape(&self, rep: &mut Report) {
        if let Self::Declared(d) = self {
            d.shape(rep);
        }
    }
}
