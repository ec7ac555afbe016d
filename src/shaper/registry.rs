//! Lanes and gates by key: created on first use, shared by every request
//! with the same keys, and dropped when idle.
//!
//! A request's lane is named by its key in every level it goes through (its
//! route's, the tenant's, the vendor's). Each level's quotas are one
//! **gate** per key, shared by every lane under it: the vendor's gate is
//! held by all of that vendor's lanes, which is what makes a pause or a
//! quota vendor-wide. Beside the vendor's gate, one vendor model per key
//! (what its answers taught) is shared the same way.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use reqwest::Request;

use crate::error::{ConfigError, Error};
use crate::gate::{Gate, GateMap};
use crate::lane::{Lane, LanePolicy, LaneSnapshot, OnIdle};
use crate::meters::Quota;
use crate::observability::{Labels, LaneMetrics, StoreMetrics};
use crate::retry::RetryBudget;
use crate::route::{Level, Route, Tag};
use crate::store::{Store, StoreFailure, StoreMode};
use crate::sync::{listed, lock, shrink};
use crate::vendor::{VendorMap, VendorModel};

type LaneMap = Mutex<HashMap<String, Arc<Lane>>>;

/// A shaper's lanes and gates by name, and what it takes to make them:
/// the levels and routes, how every lane behaves, and the store.
pub(crate) struct Registry {
    lanes: Arc<LaneMap>,
    gates: Arc<GateMap>,
    vendors: Arc<VendorMap>,
    /// Levels whose quotas changed while the shaper ran, by name.
    changed: Mutex<HashMap<String, Vec<Quota>>>,
    /// Shut down: no lane is handed out any more.
    shut: AtomicBool,
    /// How every lane behaves (its quotas come from the levels).
    policy: LanePolicy,
    /// Each vendor model's allowance of failure retries.
    budget: RetryBudget,
    routes: Vec<Route>,
    /// The shaper-wide levels, the vendor's last.
    levels: Vec<Level>,
    /// Where the gates' quotas live when a fleet shares them.
    store: Option<Store>,
    store_failure: StoreFailure,
    /// Series labelled by lane too (`ShaperBuilder::metrics_per_lane`).
    metrics_per_lane: bool,
}

/// What a [`Registry`] makes its lanes and gates of, as the builder
/// checked it.
pub(super) struct Plan {
    pub(super) policy: LanePolicy,
    pub(super) budget: RetryBudget,
    pub(super) routes: Vec<Route>,
    pub(super) levels: Vec<Level>,
    pub(super) store: Option<Store>,
    pub(super) store_failure: StoreFailure,
    pub(super) metrics_per_lane: bool,
}

impl Registry {
    pub(super) fn new(plan: Plan) -> Self {
        Self {
            lanes: Arc::default(),
            gates: Arc::default(),
            vendors: Arc::default(),
            changed: Mutex::default(),
            shut: AtomicBool::new(false),
            policy: plan.policy,
            budget: plan.budget,
            routes: plan.routes,
            levels: plan.levels,
            store: plan.store,
            store_failure: plan.store_failure,
            metrics_per_lane: plan.metrics_per_lane,
        }
    }

    /// What the lane `key` is doing, if it exists.
    pub(super) fn snapshot(&self, key: &str) -> Option<LaneSnapshot> {
        lock(&self.lanes).get(key).map(|lane| lane.snapshot())
    }

    /// How many lanes are live.
    pub(super) fn live(&self) -> usize {
        lock(&self.lanes).len()
    }

    /// What every live lane is doing.
    pub(super) fn snapshots(&self) -> Vec<LaneSnapshot> {
        lock(&self.lanes)
            .values()
            .map(|lane| lane.snapshot())
            .collect()
    }

    /// Hand out no lane any more, and close the live ones.
    pub(super) fn shut_down(&self) {
        self.shut.store(true, Ordering::Release);
        for (_, lane) in lock(&self.lanes).drain() {
            lane.close();
        }
    }

    /// Every level of the shaper named `name`, shaper-wide and in routes.
    fn levels_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Level> {
        let routed = self.routes.iter().flat_map(|route| &route.levels);
        self.levels
            .iter()
            .chain(routed)
            .filter(move |level| level.name == name)
    }

    /// Whether the levels named `level` may take `quotas` now: they exist,
    /// the quotas are valid, and no shared store holds them.
    pub(crate) fn check_quotas(&self, level: &str, quotas: &[Quota]) -> Result<(), ConfigError> {
        let field = if level.is_empty() { "vendor" } else { level };
        if self.levels_named(level).next().is_none() {
            return Err(ConfigError::new(
                format!("levels.{field}"),
                "no such level: a new level or route needs a new shaper",
            ));
        }
        if self.store.is_some() {
            return Err(ConfigError::new(
                format!("levels.{field}.quotas"),
                "with a shared store the quotas live in it for every instance: \
                 change them by rebuilding the fleet's shapers",
            ));
        }
        self.policy
            .validate(quotas)
            .map_err(|e| e.within(&format!("levels.{field}")))
    }

    /// Change the quotas of the levels named `level` (see
    /// [`Shaper::set_level_quotas`](crate::Shaper::set_level_quotas)).
    pub(super) fn requote(&self, level: &str, quotas: Vec<Quota>) -> Result<(), ConfigError> {
        self.check_quotas(level, &quotas)?;
        self.apply_quotas(level, quotas);
        Ok(())
    }

    /// [`requote`](Self::requote) with quotas already checked by
    /// [`check_quotas`](Self::check_quotas).
    pub(crate) fn apply_quotas(&self, level: &str, quotas: Vec<Quota>) {
        // The gate map's lock orders this against a gate being created:
        // a gate made before the change is requoted below, one made after
        // reads the new quotas.
        let gates = lock(&self.gates);
        lock(&self.changed).insert(level.to_owned(), quotas.clone());
        let changed: Vec<Arc<Gate>> = gates
            .values()
            .filter_map(Weak::upgrade)
            .filter(|gate| gate.level() == level)
            .collect();
        drop(gates);
        for gate in &changed {
            gate.requote(&quotas);
        }
        // The models beside the changed gates follow once each.
        let models: Vec<Arc<VendorModel>> = lock(&self.vendors)
            .values()
            .filter_map(Weak::upgrade)
            .filter(|model| model.gate().level() == level)
            .collect();
        for model in &models {
            model.requoted();
        }
        for lane in lock(&self.lanes).values() {
            if lane.holds_level(level) {
                lane.requoted();
            }
        }
    }

    /// The levels a request on `route` goes through: the route's, then the
    /// shaper's (unless the route stands alone).
    fn levels_for<'a>(&'a self, route: Option<&'a Route>) -> impl Iterator<Item = &'a Level> {
        let shared = if route.is_some_and(|route| route.alone) {
            &[][..]
        } else {
            &self.levels[..]
        };
        route
            .into_iter()
            .flat_map(|route| &route.levels)
            .chain(shared)
    }

    fn route_for(&self, request: &Request) -> Option<&Route> {
        self.routes.iter().find(|route| route.matches(request))
    }

    /// The lane of `request`, created on first use: named by its key in
    /// every level, and sharing the gate of each.
    pub(super) fn lane_for(
        &self,
        request: &Request,
        tag: Option<&Tag>,
    ) -> Result<Arc<Lane>, Error> {
        let route = self.route_for(request);
        let levels: Vec<&Level> = self.levels_for(route).collect();
        let keys: Vec<String> = levels
            .iter()
            .map(|level| level.lane_name(request, tag))
            .collect();
        let (Some(vendor_level), Some(vendor_key)) = (levels.last(), keys.last()) else {
            return Err(Error::NoQuota {
                url: request.url().to_string(),
            });
        };
        let mut name = keys.join(" | ");
        // A route without levels of its own still has settings of its own
        // (its answers, its store failure, its tokens): its requests wait in a lane of
        // their own, under the same gates.
        if let Some(route) = route.filter(|r| r.levels.is_empty()) {
            name = format!("{} | {name}", route.name);
        }
        let mut lanes = lock(&self.lanes);
        if self.shut.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        if let Some(lane) = lanes.get(&name)
            && lane.is_running()
        {
            return Ok(lane.clone());
        }
        // New, or its dispatcher ended with the runtime it ran on (a
        // shaper outlives the runtimes of several tests, or a runtime
        // rebuilt after a panic): start it here. Its gates, and with them
        // the quota spent and any pause, carry over.
        // Every level's quotas are a shared gate, even when one lane is all
        // that uses it yet: the vendor's quota must be one gate for all.
        let vendor_gate = self.gate_for(vendor_level, vendor_key);
        let vendor = self.vendor_for(vendor_key, &vendor_gate);
        let mut shared: Vec<Arc<Gate>> = levels
            .iter()
            .zip(&keys)
            .take(levels.len() - 1)
            .map(|(level, key)| self.gate_for(level, key))
            .collect();
        shared.push(vendor_gate);
        let labels = Labels {
            vendor: vendor_key.clone(),
            level: match levels[0].name.as_str() {
                "" => "vendor".to_owned(),
                name => name.to_owned(),
            },
            route: route.map(|route| route.name.clone()).unwrap_or_default(),
        };
        let per_lane = self.metrics_per_lane.then_some(name.as_str());
        let remote = self.store.as_ref().map(|store| {
            let failure = route
                .and_then(|route| route.store_failure)
                .unwrap_or(self.store_failure);
            let quotas: Vec<Vec<Quota>> = levels.iter().map(|l| self.quotas_of(l)).collect();
            let headroom = self.policy.headroom;
            let metrics =
                StoreMetrics::new(&labels, per_lane, &StoreMode::ALL.map(StoreMode::label));
            let link = store.link(shared.clone(), &keys, &quotas, headroom, failure, metrics);
            Arc::new(link)
        });
        let mut policy = self.policy.clone();
        if let Some(answers) = route.and_then(|r| r.answers.clone()) {
            policy.answers = answers;
        }
        #[cfg(feature = "tokens")]
        if let Some(tokens) = route.and_then(|r| r.tokens) {
            policy.tokens = Some(tokens);
        }
        let on_idle = evict_when_idle(Arc::downgrade(&self.lanes), name.clone());
        let metrics = LaneMetrics::new(&labels, per_lane);
        let lane = Arc::new(Lane::spawn(
            name.clone(),
            labels,
            metrics,
            policy,
            (shared, vendor),
            Some(on_idle),
            remote,
        ));
        lanes.insert(name, lane.clone());
        Ok(lane)
    }

    /// The quotas of `level` now: as built, or as last changed live.
    fn quotas_of(&self, level: &Level) -> Vec<Quota> {
        lock(&self.changed)
            .get(&level.name)
            .cloned()
            .unwrap_or_else(|| level.quotas.clone())
    }

    /// The shared gate of `level` for `key`, created on first use.
    fn gate_for(&self, level: &Level, key: &str) -> Arc<Gate> {
        let share = self.store.as_ref().map_or(1, Store::fleet_size);
        listed(&self.gates, key, |listing| {
            let settings = self.policy.gate_settings();
            let quotas = self.quotas_of(level);
            Gate::new(&level.name, &quotas, settings, Some(listing), share)
        })
    }

    /// The model of the vendor whose gate for `key` is `gate`, created on
    /// first use.
    fn vendor_for(&self, key: &str, gate: &Arc<Gate>) -> Arc<VendorModel> {
        listed(&self.vendors, key, |listing| {
            let settings = self.policy.vendor_settings(self.budget);
            VendorModel::new(gate.clone(), settings, Some(listing))
        })
    }
}

/// Drop an idle lane, unless somebody still holds it: the map's lock is
/// also taken to hand a lane out, so nobody can pick it up meanwhile.
fn evict_when_idle(lanes: Weak<LaneMap>, key: String) -> OnIdle {
    Box::new(move || {
        let Some(lanes) = lanes.upgrade() else { return };
        let mut lanes = lock(&lanes);
        if lanes
            .get(&key)
            .is_some_and(|lane| Arc::strong_count(lane) == 1 && lane.is_idle())
        {
            lanes.remove(&key);
            shrink(&mut lanes);
        }
    })
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("levels", &self.levels)
            .field("routes", &self.routes)
            .field("lanes", &lock(&self.lanes).len())
            .finish_non_exhaustive()
    }
}
