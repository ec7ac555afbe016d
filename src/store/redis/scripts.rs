//! The Lua scripts, each with the meters' arithmetic (`meters.lua`)
//! before it, and the check of the user's permissions a store runs once.

use std::sync::LazyLock;

use redis::Script;

pub(super) static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../meters.lua"),
        include_str!("../reserve.lua")
    ))
});
pub(super) static PAUSE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../meters.lua"),
        include_str!("../pause.lua")
    ))
});
pub(super) static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../meters.lua"),
        include_str!("../settle.lua")
    ))
});
pub(super) static PERMISSIONS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../permissions.lua")));
