//! The system under test, one seam with two kinds behind it: the
//! reference payments pipeline (in process, or with a program under test
//! as processes), and a declared system (the user's service, relays and
//! consumers as processes). The run's skeleton (`super::execute_keeping`)
//! asks each the same questions in the same order.

use super::declared::{Declared, RelayStall, Stall, Stalls};
use super::drive::Undrained;
use super::history::History;
use super::infra::Infra;
use super::phases::Checked;
use super::reference::{self, Reference};
use super::series::FromBroker;
use crate::context::{Ctx, Named};
use crate::domain::names::RunNames;
use crate::error::Result;
use crate::harness::infra::Endpoints;
use crate::nemesis::process::program::Programs;
use crate::nemesis::proxy::Lanes;
use crate::provider::Record;
use crate::report::progress::Progress;
use crate::report::shown::Shown;
use crate::report::Report;
use crate::scenario::Scenario;
use crate::store::Store;
use std::path::Path;
use std::time::Duration;

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

    /// Reaches the system before anything else: a declared service that
    /// never answers is an error (exit 3).
    pub async fn reach(&self, ctx: &Ctx) -> Result<()> {
        match self {
            Self::Reference(_) => Ok(()),
            Self::Declared(d) => d.reach(ctx).await,
        }
    }

    /// The workload, which records its intent as it goes (the payments
    /// pipeline's in the context, a declared system's in its record).
    pub async fn workload(&self, ctx: &Ctx, progress: &Progress) -> Result<()> {
        match self {
            Self::Reference(r) => r.workload(ctx, progress).await,
            Self::Declared(d) => d.workload(ctx, progress).await,
        }
    }

    /// The drain: until nothing is left to publish or consume, or its clock
    /// runs out (`drive::drain_until_done`).
    pub async fn drain(&self, ctx: &Ctx) -> std::result::Result<(), Undrained> {
        match self {
            Self::Reference(_) => reference::drain(ctx).await,
            Self::Declared(d) => d.drain(ctx).await,
        }
    }

    /// The rows a relay left with the faults off, as its stall, when the
    /// system's checkers tell a stall apart (the payments checker counts
    /// them as `unpublished leftover`s).
    pub async fn relay_stall(&self, left: i64, waited: Duration, fault_free: Duration) -> Option<RelayStall> {
        match self {
            Self::Reference(_) => None,
            Self::Declared(d) => Some(d.relay_stall(left, waited, fault_free).await),
        }
    }

    /// Whether the system can say what it has pending, and so settles.
    pub fn settles(&self) -> bool {
        matches!(self, Self::Declared(_))
    }

    /// The settle after the drain: None once quiet, the stall when its
    /// pending work outlasted the clock.
    pub async fn settle(&self, ctx: &Ctx, first: &mut Option<u64>) -> Result<Option<Stall>> {
        match self {
            Self::Reference(_) => Ok(None),
            Self::Declared(d) => d.settle(ctx, first).await,
        }
    }

    /// The programs under test, when the system runs any.
    pub fn programs(&self) -> Option<&Programs> {
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

    /// The kind's checkers over what the run recorded and its ground
    /// truth (read through `store`).
    pub async fn check(
        &self,
        ctx: &Ctx,
        store: &Store,
        history: History,
        stalls: &Stalls,
        pending: Option<u64>,
    ) -> Result<Checked> {
        match self {
            Self::Reference(_) => reference::check(ctx, store, history).await,
            Self::Declared(d) => d.check(ctx, store, history, stalls, pending).await,
        }
    }

    /// What the run recorded, taken once, now that every component has
    /// stopped: the checkers read it ([`History`]).
    pub fn history(&self, ctx: &Ctx, provider: Option<Record>, still_running: bool) -> History {
        let (intent, operations) = match self {
            Self::Reference(_) => (ctx.intent.take(), vec![]),
            Self::Declared(d) => (vec![], d.take_operations()),
        };
        History {
            intent,
            operations,
            faults: ctx.faults.history(),
            summary: ctx.faults.summary(),
            fired: ctx.faults.fired_schedule(),
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

    /// What the report says of the system: its scenario section's shape,
    /// and its words for what the run drove ([`Shown`]), chosen here once
    /// so that no report asks which kind ran. Once the report is built, its
    /// timings included.
    pub fn shape(&self, rep: &mut Report) {
        rep.shown = match self {
            Self::Reference(_) => Shown::payments(rep),
            Self::Declared(d) => {
                d.shape(rep);
                // A run cut short before its checkers has no figures: its
                // words are still a declared system's.
                Shown::declared(rep, &rep.system.clone().unwrap_or_default())
            }
        };
    }
}

/// The words of a report saved before its kind chose them (`chaos report`
/// reads those too): a report with a declared system's figures is one.
pub fn shown_of_saved(rep: &mut Report) {
    if rep.shown.driven.is_empty() {
        rep.shown = match &rep.system {
            Some(f) => Shown::declared(rep, f),
            None => Shown::payments(rep),
        };
    }
}
