//! A lane's name ([`LaneName`]), read where its parts are already kept.

use std::fmt;

use super::gates::Gates;

/// A lane's name as it reads: its prefix (a route's name, or a standalone
/// lane's own), then each of its gates' keys, joined by ` | `:
/// `tenant/acme | https://api.vendor.com`. A lane keeps no copy of it:
/// its gates hold every level's key already, and a copy in each of a
/// million tenants' lanes took 64 bytes of each.
#[derive(Clone, Copy)]
pub(crate) struct LaneName<'a> {
    prefix: Option<&'a str>,
    gates: &'a Gates,
}

/// What joins the parts of a lane's name: the registry writes a
/// request's lane name with it, and a lane reads its own with it.
pub(crate) const JOIN: &str = " | ";

impl<'a> LaneName<'a> {
    pub(super) fn new(prefix: Option<&'a str>, gates: &'a Gates) -> Self {
        Self { prefix, gates }
    }

    /// The parts of the name, in order (a gate listed nowhere, such as a
    /// standalone lane's own, adds none).
    fn parts(self) -> impl Iterator<Item = &'a str> {
        let keys = self.gates.iter().filter_map(|gate| gate.key());
        self.prefix.into_iter().chain(keys)
    }

    /// True when the name reads `name`: compared part by part, with no
    /// string made.
    pub(crate) fn is(self, name: &str) -> bool {
        let mut rest = name;
        for (i, part) in self.parts().enumerate() {
            let joined = if i == 0 {
                Some(rest)
            } else {
                rest.strip_prefix(JOIN)
            };
            match joined.and_then(|joined| joined.strip_prefix(part)) {
                Some(after) => rest = after,
                None => return false,
            }
        }
        rest.is_empty()
    }
}

impl fmt::Display for LaneName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parts().enumerate() {
            if i > 0 {
                f.write_str(JOIN)?;
            }
            f.write_str(part)?;
        }
        Ok(())
    }
}

impl fmt::Debug for LaneName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::gate::{Gate, GateLevel, GateMap, GateSettings, Listed};
    use crate::meters::Quota;

    /// Gates listed under `keys`, and one listed nowhere after them.
    fn listed(keys: &[&str]) -> Gates {
        let quotas = Arc::from([Quota::leaky_bucket(10, Duration::from_secs(1))]);
        let settings = GateSettings {
            headroom: Duration::ZERO,
            max_pause: Duration::from_secs(60),
            hears: true,
        };
        let level = Arc::new(GateLevel::new("", quotas, settings));
        let map = Arc::new(GateMap::default());
        let listed = keys
            .iter()
            .map(|key| map.gate(key, || level.clone(), |listed, _| Gate::new(listed, 1)));
        let nowhere = Arc::new(Gate::new(Listed::nowhere(level.clone()), 1));
        listed.chain([nowhere]).collect()
    }

    /// A name reads as its parts joined, and is that string and no other.
    #[test]
    fn reads_as_its_prefix_and_keys_joined() {
        let gates = listed(&["tenant/acme", "https://api.vendor.com"]);
        for (prefix, written) in [
            (None, "tenant/acme | https://api.vendor.com"),
            (Some("chat"), "chat | tenant/acme | https://api.vendor.com"),
        ] {
            let name = LaneName::new(prefix, &gates);
            assert_eq!(name.to_string(), written);
            assert!(name.is(written), "{written}");
            for other in [
                "",
                "tenant/acme",
                "tenant/acme | https://api.vendor.com | ",
                "tenant/acme |https://api.vendor.com",
                "tenant/acm | https://api.vendor.com",
                "chat | tenant/acme | https://api.vendor.co",
            ] {
                assert!(!name.is(other), "{written} is not {other:?}");
            }
        }
        let alone = listed(&[]);
        let name = LaneName::new(Some("standalone"), &alone);
        assert_eq!(name.to_string(), "standalone");
        assert!(name.is("standalone") && !name.is("standalone | "));
    }
}
