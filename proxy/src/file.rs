//! Reading the config file, at startup and on each reload.

use std::path::Path;

use callshaper::config::ShaperConfig;

/// The file's config and its bytes (a reload compares them): TOML, or JSON
/// when the name ends in `.json`. The error names the file, then the field.
pub(crate) async fn read(path: &Path) -> Result<(ShaperConfig, Vec<u8>), String> {
    let text = bytes(path).await?;
    let config = parse(path, &text)?;
    Ok((config, text))
}

/// The file's bytes.
pub(crate) async fn bytes(path: &Path) -> Result<Vec<u8>, String> {
    let owned = path.to_owned();
    // A config file is small, but a read can still block (a network
    // mount): off the runtime's workers.
    tokio::task::spawn_blocking(move || std::fs::read(owned))
        .await
        .map_err(std::io::Error::other)
        .and_then(|read| read)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))
}

/// `text` read as `path`'s format.
pub(crate) fn parse(path: &Path, text: &[u8]) -> Result<ShaperConfig, String> {
    let named = |e: callshaper::ConfigError| format!("{}: {e}", path.display());
    let text = std::str::from_utf8(text)
        .map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
    if path.extension().is_some_and(|ext| ext == "json") {
        ShaperConfig::from_json(text).map_err(named)
    } else {
        ShaperConfig::from_toml(text).map_err(named)
    }
}
