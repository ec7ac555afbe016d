//! Lanes and gates by key: created on first use, shared by every request
//! with the same keys, and dropped when idle.
//!
//! A request's lane is named by its key in every level it goes through (its
//! route's, the tenant's, the vendor's). Each level's quotas are one
//! **gate** per key, shared by every lane under it: the vendor's gate is
//! held by all of that vendor's lanes, which is what makes a pause or a
//! quota vendor-wide. Beside the vendor's gate, one vendor model per key
//! (what its answers taught) is shared the same way.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use reqwest::Request;
use reqwest::header::HeaderName;
use smallvec::SmallVec;

use super::lanes::Lanes;
use crate::error::{ConfigError, Error};
use crate::gate::{Gate, GateLevel, GateMap};
use crate::lane::{JOIN, Lane, LanePolicy, LaneSnapshot, Road};
use crate::meters::Quota;
use crate::observability::{Labels, Series, StoreMetrics, shown_url};
use crate::retry::RetryBudget;
use crate::route::{LaneKey, Level, Route, Tag, write_free};
use crate::store::{Store, StoreFailure, StoreMode};
use crate::sync::{Listings, Names, found, listed, living};
use crate::vendor::{VendorMap, VendorModel};

/// A shaper's lanes and gates by name, and what it takes to make them:
/// the levels and routes, how every lane behaves, and the store.
pub(crate) struct Registry {
    lanes: Arc<Lanes>,
    gates: Arc<GateMap>,
    vendors: Arc<VendorMap>,
    /// What lanes of a route, level and vendor share (see [`Road`]), by
    /// their labels and route.
    roads: Arc<Listings<Road>>,
    /// Each level by name: its quotas now (as built, or as last changed
    /// live), its settings and name, which its gates share.
    /// Hashed as the lanes are: a tenant's first request finds its
    /// level here (by SipHash, 160 instructions of it).
    gate_levels: Names<String, Arc<GateLevel>>,
    /// How every lane behaves (its quotas come from the levels).
    policy: LanePolicy,
    /// `policy` for lanes on no route, shared by all of them.
    shaper_policy: Arc<LanePolicy>,
    /// `policy` with each route's answers and tokens, by route.
    route_policies: Vec<Arc<LanePolicy>>,
    /// The first part of the names of each route's lanes, if they have
    /// one (see `prefix`), by route.
    route_prefixes: Vec<Option<Arc<str>>>,
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
    /// The most lanes live at once (none: no cap).
    pub(super) max_lanes: Option<usize>,
}

impl Registry {
    pub(super) fn new(plan: Plan) -> Self {
        let gates = Arc::new(GateMap::default());
        let route_policies = plan
            .routes
            .iter()
            .map(|route| {
                let mut policy = plan.policy.clone();
                if let Some(answers) = &route.answers {
                    policy.answers = answers.clone();
                }
                #[cfg(feature = "tokens")]
                if let Some(tokens) = route.tokens {
                    policy.tokens = Some(tokens);
                }
                Arc::new(policy)
            })
            .collect();
        Self {
            shaper_policy: Arc::new(plan.policy.clone()),
            route_policies,
            route_prefixes: prefixes(&plan),
            lanes: Arc::new(Lanes::new(
                plan.max_lanes,
                plan.policy.idle_timeout,
                gates.clone(),
            )),
            gates,
            vendors: Arc::default(),
            roads: Arc::default(),
            gate_levels: every_level(&plan).fold(Names::default(), |mut levels, level| {
                // Levels of one name are one level (one gate per key, and
                // one change of quotas): the first one's quotas, as the
                // levels are read everywhere else.
                levels.entry(level.name.clone()).or_insert_with(|| {
                    let settings = plan.policy.gate_settings();
                    let quotas = Arc::from(level.quotas.as_slice());
                    Arc::new(GateLevel::new(&level.name, quotas, settings))
                });
                levels
            }),
            policy: plan.policy,
            budget: plan.budget,
            routes: plan.routes,
            levels: plan.levels,
            store: plan.store,
            store_failure: plan.store_failure,
            metrics_per_lane: plan.metrics_per_lane,
        }
    }

    /// The headers a level is keyed by (`LaneKey::Header`): an API key the
    /// shaper never shows, which a redirect to another origin drops.
    pub(super) fn key_headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.all_levels().filter_map(|level| match &level.key {
            LaneKey::Header(name) => Some(name),
            _ => None,
        })
    }

    /// What the lane `key` is doing, if it exists.
    pub(super) fn snapshot(&self, key: &str) -> Option<LaneSnapshot> {
        self.lanes.snapshot(key)
    }

    /// How many lanes are live.
    pub(super) fn live(&self) -> usize {
        self.lanes.len()
    }

    /// What every live lane is doing.
    pub(super) fn snapshots(&self) -> Vec<LaneSnapshot> {
        self.lanes
            .all()
            .iter()
            .map(|lane| lane.snapshot())
            .collect()
    }

    /// Hand out no lane any more, and close the live ones.
    pub(super) fn shut_down(&self) {
        self.lanes.shut_down();
    }

    /// Every level of the shaper, shaper-wide then in routes.
    fn all_levels(&self) -> impl Iterator<Item = &Level> {
        let routed = self.routes.iter().flat_map(|route| &route.levels);
        self.levels.iter().chain(routed)
    }

    /// Every level of the shaper named `name`, shaper-wide and in routes.
    fn levels_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Level> {
        self.all_levels().filter(move |level| level.name == name)
    }

    /// Whether the levels named `level` may take `quotas` now: they exist,
    /// the quotas are valid, and no shared store holds them.
    pub(crate) fn check_quotas(&self, level: &str, quotas: &[Quota]) -> Result<(), ConfigError> {
        let field = if level.is_empty() { "vendor" } else { level };
        if self.levels_named(level).next().is_none() {
            return Err(ConfigError::new(
                format!("levels.{field}"),
                "the running shaper has no such level: a new vendor, level or route needs a new shaper",
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
        // Under the gate map's lock, which orders this against a gate
        // being made or waking: one made before the change is requoted
        // below, one made after reads the new quotas (a resting gate's
        // meters catch up as it wakes).
        let changed: Vec<Arc<Gate>> = self
            .gates
            .live_after(|| {
                if let Some(gate_level) = self.gate_levels.get(level) {
                    gate_level.requote(&quotas);
                }
            })
            .into_iter()
            .filter(|gate| gate.level() == level)
            .collect();
        for gate in &changed {
            gate.requote();
        }
        // The models beside the changed gates follow once each.
        let models: Vec<Arc<VendorModel>> = living(&self.vendors)
            .into_iter()
            .filter(|model| model.gate().level() == level)
            .collect();
        for model in &models {
            model.requoted();
        }
        for lane in self.lanes.all() {
            if lane.holds_level(level) {
                lane.requoted();
            }
        }
    }

    /// The levels a request on `route` goes through: the route's, then the
    /// shaper's (unless the route stands alone).
    fn levels_for<'a>(&'a self, route: Option<&'a Route>) -> impl Iterator<Item = &'a Level> {
        levels_of(&self.levels, route)
    }

    /// The most a request to `base`'s host can cost and still fit every
    /// quota it goes through, over each route one may take there (routes
    /// match in order: one that takes every such request ends the
    /// search); `None` when none goes through a quota.
    #[cfg(feature = "proxy")]
    pub(crate) fn largest_cost_at(&self, base: &reqwest::Url) -> Option<u64> {
        let most = |route| self.levels_for(route).map(Level::largest_cost).min();
        let mut largest = None;
        for route in &self.routes {
            let (may, every) = route.reaches(base);
            if may {
                largest = largest.max(most(Some(route)));
            }
            if every {
                return largest;
            }
        }
        largest.max(most(None))
    }

    fn route_for(&self, request: &Request) -> Option<&Route> {
        self.routes.iter().find(|route| route.matches(request))
    }

    /// The lane of `request`, created on first use: named by its key in
    /// every level, and sharing the gate of each.
    pub(super) fn lane_for(&self, request: &Request, tag: Option<&Tag>) -> Result<Lane, Error> {
        let route = self.route_for(request);
        if self.levels_for(route).next().is_none() {
            return Err(Error::NoQuota {
                url: shown_url(request.url()),
            });
        }
        // The name is written in one string: a found lane (nearly every
        // request's) costs no other allocation.
        let mut name = String::with_capacity(64);
        if let Some(prefix) = self.prefix(route) {
            name.push_str(prefix);
            name.push_str(JOIN);
        }
        // Where each level's key is in the name: a new lane's keys are read
        // there, with no string or list of their own (a lane's levels are
        // nearly always a tenant's and the vendor's).
        let mut spans: SmallVec<[(usize, usize); 4]> = SmallVec::new();
        for (i, level) in self.levels_for(route).enumerate() {
            if i > 0 {
                name.push_str(JOIN);
            }
            let start = name.len();
            level.write_lane_name(request, tag, &mut name);
            spans.push((start, name.len()));
        }
        let hashed = self.lanes.hashed(&name);
        if let Some(lane) = self.lanes.find(&hashed) {
            self.lanes.keep_swept();
            return Ok(lane);
        }
        let levels: SmallVec<[&Level; 4]> = self.levels_for(route).collect();
        let keys: SmallVec<[&str; 4]> = spans
            .iter()
            .map(|&(start, end)| &name[start..end])
            .collect();
        self.lanes.open(&hashed, |listed| {
            self.make_lane(&name, route, &levels, &keys, listed)
        })
    }

    /// A new lane `name` for `levels`, named by `keys` in each (the
    /// vendor's last), on `route`, `listed` in the map of lanes under that
    /// hash of its name.
    fn make_lane(
        &self,
        name: &str,
        route: Option<&Route>,
        levels: &[&Level],
        keys: &[&str],
        listed: u64,
    ) -> Lane {
        // `lane_for` made sure there is a level, and a key for each.
        let (vendor_level, vendor_key) = (levels[levels.len() - 1], keys[keys.len() - 1]);
        let names = (
            vendor_key,
            match levels[0].name.as_str() {
                "" => "vendor",
                name => name,
            },
            route.map_or("", |route| route.name.as_str()),
        );
        let per_lane = self.metrics_per_lane.then_some(name);
        // Every level's quotas are a shared gate, even when one lane is all
        // that uses it yet: the vendor's quota must be one gate for all. A
        // road found holds its vendor's model, and in it the vendor's gate.
        let vendor = || self.vendor_for(vendor_level, vendor_key);
        let road = self.road_for(route, names, per_lane, vendor);
        let vendor_gate = road.vendor().gate().clone();
        // Nearly always a tenant's and the vendor's: no list of their own.
        let mut shared: SmallVec<[Arc<Gate>; 2]> = SmallVec::with_capacity(levels.len());
        shared.extend(
            levels
                .iter()
                .zip(keys)
                .take(levels.len() - 1)
                .map(|(level, key)| self.gate_for(level, key)),
        );
        shared.push(vendor_gate);
        let remote = self.store.as_ref().map(|store| {
            let failure = route
                .and_then(|route| route.store_failure)
                .unwrap_or(self.store_failure);
            let quotas: Vec<Vec<Quota>> = levels
                .iter()
                .map(|l| self.gate_level(l).quotas().to_vec())
                .collect();
            let headroom = self.policy.headroom;
            let metrics = StoreMetrics::new(
                &labelled(names),
                per_lane,
                &StoreMode::ALL.map(StoreMode::label),
            );
            let link = store.link(shared.to_vec(), keys, &quotas, headroom, failure, metrics);
            Arc::new(link)
        });
        Lane::open(road, shared, remote, listed)
    }

    /// How the lanes of `route` behave: the shaper's policy, with the
    /// route's answers and tokens; one for all of them.
    fn policy_for(&self, route: Option<&Route>) -> Arc<LanePolicy> {
        match self.route_at(route) {
            Some(at) => self.route_policies[at].clone(),
            None => self.shaper_policy.clone(),
        }
    }

    /// Where `route` is among the shaper's routes.
    fn route_at(&self, route: Option<&Route>) -> Option<usize> {
        route.and_then(|route| self.routes.iter().position(|r| std::ptr::eq(r, route)))
    }

    /// The first part of the names of `route`'s lanes, before their
    /// levels' keys, if they have one (see [`prefixes`]). Read by a
    /// request writing its lane's name, and kept by the lanes' road.
    fn prefix(&self, route: Option<&Route>) -> Option<&Arc<str>> {
        self.route_at(route)
            .and_then(|at| self.route_prefixes[at].as_ref())
    }

    /// The road of the lanes on `route` labelled `names` (vendor, level,
    /// route): their name's prefix, their policy, their series and their
    /// vendor's model (the one `vendor` finds or makes, for the vendor
    /// `names` gives); one for all of them, unless series per lane were
    /// asked for (`lane`). Made only for a new road: a tenant's new lane
    /// nearly always finds its own, and with it the model, which its
    /// vendor's key (part of the road's) would find: the road holds it, so
    /// the vendors' map lists it.
    fn road_for(
        &self,
        route: Option<&Route>,
        names: (&str, &str, &str),
        lane: Option<&str>,
        vendor: impl FnOnce() -> Arc<VendorModel>,
    ) -> Arc<Road> {
        let make = |listing, vendor| {
            // A lane's name is read off this and its gates' keys, which
            // are the spans of its name (see `lane_for`).
            let prefix = self.prefix(route).cloned();
            let series = Series::new(labelled(names), lane);
            let retired = Some(self.lanes.nudge());
            let behaves = (self.policy_for(route), vendor);
            Road::new(prefix, series, behaves, (retired, listing))
        };
        if lane.is_some() {
            return Arc::new(make(None, vendor()));
        }
        // The route, by where it is, gives the third label and the rest.
        // Written part by part: a formatter took a new tenant's first
        // request a thousand instructions.
        let (vendor_key, level, _) = names;
        let mut key = String::with_capacity(vendor_key.len() + level.len() + 8);
        for part in [vendor_key, "\n", level, "\n"] {
            key.push_str(part);
        }
        if let Some(at) = self.route_at(route) {
            // Into the key, not a string of its own.
            let _ = write!(key, "{at}");
        }
        if let Some(road) = found(&self.roads, &key) {
            return road;
        }
        // Outside the roads' lock: a new vendor's model is made under its
        // own map's.
        let vendor = vendor();
        listed(&self.roads, &key, |listing| make(Some(listing), vendor))
    }

    /// What the gates of `level` share: its quotas now, its settings.
    fn gate_level(&self, level: &Level) -> Arc<GateLevel> {
        // Every level of the plan is there; a stray one gets its own.
        self.gate_levels
            .get(&level.name)
            .cloned()
            .unwrap_or_else(|| {
                let quotas = Arc::from(level.quotas.as_slice());
                Arc::new(GateLevel::new(
                    &level.name,
                    quotas,
                    self.policy.gate_settings(),
                ))
            })
    }

    /// The shared gate of `level` for `key`, created on first use.
    fn gate_for(&self, level: &Level, key: &str) -> Arc<Gate> {
        let share = self.store.as_ref().map_or(1, Store::fleet_size);
        let level_of = || self.gate_level(level);
        self.gates
            .gate(key, level_of, |listed, rested| match rested {
                // Only a gate on no store rests.
                Some(meters) => Gate::resumed(listed, meters),
                None => Gate::new(listed, share),
            })
    }

    /// The model of the vendor `key` names at `level`, and in it the
    /// vendor's gate, created on first use. A model holds its gate, which
    /// is the gate map's for `key` while it lives: a new lane under a known
    /// vendor finds both in one lookup. The gate is made before the model
    /// and outside its map's lock, which a model's last drop takes.
    fn vendor_for(&self, level: &Level, key: &str) -> Arc<VendorModel> {
        if let Some(model) = found(&self.vendors, key) {
            return model;
        }
        let gate = self.gate_for(level, key);
        listed(&self.vendors, key, |listing| {
            let settings = self.policy.vendor_settings(self.budget);
            VendorModel::new(gate, settings, Some(listing))
        })
    }
}

/// The labels of a lane's series, from its vendor's key, its level's name
/// and its route's.
fn labelled((vendor, level, route): (&str, &str, &str)) -> Labels {
    Labels {
        vendor: vendor.to_owned(),
        level: level.to_owned(),
        route: route.to_owned(),
    }
}

/// The levels a request on `route` goes through, given the shaper's
/// `levels`: the route's, then the shaper's unless the route is alone.
fn levels_of<'a>(levels: &'a [Level], route: Option<&'a Route>) -> impl Iterator<Item = &'a Level> {
    let shared = if route.is_some_and(|route| route.alone) {
        &[][..]
    } else {
        levels
    };
    route
        .into_iter()
        .flat_map(|route| &route.levels)
        .chain(shared)
}

/// The first part of the names of each route's lanes, if any: the
/// route's name, unless its lanes are the only ones under their levels.
///
/// A request finds its lane by name, and with the lane its road: the
/// route's answers, tokens, store failure and series. Names are its
/// levels' keys, and a level is one level by name wherever it is
/// declared: two routes through levels of the same names (a tenant's
/// level on each of a vendor's endpoints) would name the same lanes, and
/// a request on one would take the other's lanes, and its settings, when
/// that one had made them first. So the names of each level sequence go
/// to one owner, unprefixed: the requests on no route (the shaper's
/// levels), else the last route through them (a catch-all route comes
/// last); every other route's lanes begin with its name. A route's name
/// is its own (the builder refuses two of one name).
fn prefixes(plan: &Plan) -> Vec<Option<Arc<str>>> {
    let names = |route| -> Vec<&str> {
        levels_of(&plan.levels, route)
            .map(|level| level.name.as_str())
            .collect()
    };
    let mut owned = vec![names(None)];
    let mut prefixes: Vec<Option<Arc<str>>> = plan
        .routes
        .iter()
        .rev()
        .map(|route| {
            let levels = names(Some(route));
            if owned.contains(&levels) {
                let mut prefix = String::new();
                write_free(&route.name, &mut prefix);
                Some(Arc::from(prefix))
            } else {
                owned.push(levels);
                None
            }
        })
        .collect();
    prefixes.reverse();
    prefixes
}

/// The shaper's levels, then its routes' (the order `levels_named` reads
/// them in).
fn every_level(plan: &Plan) -> impl Iterator<Item = &Level> {
    let routed = plan.routes.iter().flat_map(|route| &route.levels);
    plan.levels.iter().chain(routed)
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("levels", &self.levels)
            .field("routes", &self.routes)
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}
