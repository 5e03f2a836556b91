//! Remote locations (a URL of one of the stores `tensora_remote::schemes()` lists, shown by
//! [`stores_help`] after each command's help) for `inspect`, `load`, `hash` and `verify`: the
//! shared flags, and opening through `tensora_remote` (whose `digests` and `verify` do the work of
//! `hash URL` and `verify URL`).

use std::path::Path;

use tensora_remote::{
    CacheOptions, CacheWrites, Location, RemoteCheckpoint, RemoteOptions, StoreConfig, Unversioned,
    open_remote,
};

/// How to reach an object store; ignored for local paths.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RemoteArgs {
    /// Endpoint of the store a remote PATH names: what it means for each store, and where each
    /// store's credentials come from, is listed at the end of this help.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Allow a plain http:// object-store endpoint (http:// origins of HTTP locations always are).
    #[arg(long)]
    pub allow_http: bool,
    /// Send unsigned object-store requests (public buckets and containers); no credentials needed.
    #[arg(long)]
    pub anonymous: bool,
    /// Load objects whose server sends neither an ETag nor a Last-Modified date (normally
    /// refused: a replacement during the load could not be noticed).
    #[arg(long)]
    pub allow_unversioned: bool,
    /// The most opening a remote checkpoint may take, every request and retry included, in
    /// seconds (default 120).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub open_timeout: Option<std::time::Duration>,
    /// Keep a verified local copy of every object loaded in DIR: written from where each range
    /// landed (no second download), resumed after an interruption, confirmed by one HEAD per
    /// object on the next load (which then reads local files). `tensora cache ls|rm|verify DIR`
    /// inspects it.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<std::path::PathBuf>,
    /// With --cache: send no request at all; load from the cache only.
    #[arg(long, requires = "cache")]
    pub offline: bool,
    /// With --cache: evict least recently used objects while the cache holds more than this
    /// many bytes (units as for --budget).
    #[arg(long, value_name = "SIZE", requires = "cache", value_parser = crate::units::parse_bytes)]
    pub cache_max: Option<u64>,
    /// With --cache: write the copies behind the load (the load returns at the network's pace,
    /// the copies are finished after; `tensora load` waits for them before it reports) or before
    /// each range lands (every range is on disk when the load returns).
    #[arg(long, value_enum, value_name = "WHEN", requires = "cache", default_value = "behind")]
    pub cache_writes: CacheWritesArg,
}

/// `--cache-writes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CacheWritesArg {
    /// Behind the load.
    #[default]
    Behind,
    /// Before each range lands.
    Before,
}

/// A positive number of seconds (fractions allowed).
fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => {
            std::time::Duration::try_from_secs_f64(s).map_err(|e| e.to_string())
        }
        _ => Err(format!("{text:?} is not a positive number of seconds")),
    }
}

impl RemoteArgs {
    /// Remote options with these store settings and the defaults for everything else.
    pub fn options(&self) -> RemoteOptions {
        RemoteOptions {
            store: StoreConfig {
                endpoint: self.endpoint.clone(),
                allow_http: self.allow_http,
                anonymous: self.anonymous,
                ..StoreConfig::default()
            },
            unversioned: if self.allow_unversioned { Unversioned::Allow } else { Unversioned::Refuse },
            open_deadline: self.open_timeout.unwrap_or(RemoteOptions::default().open_deadline),
            cache: self.cache.as_ref().map(|dir| CacheOptions {
                dir: dir.clone(),
                size_max_bytes: self.cache_max,
                offline: self.offline,
                writes: match self.cache_writes {
                    CacheWritesArg::Behind => CacheWrites::Behind,
                    CacheWritesArg::Before => CacheWrites::BeforeLanding,
                },
            }),
            ..RemoteOptions::default()
        }
    }
}

/// The stores a remote PATH may name, one line each with what `--endpoint` means for it and
/// where its credentials come from: `tensora_remote::schemes()`, the one list of them. Each
/// command that takes a remote PATH shows it after its help.
pub fn stores_help() -> String {
    let mut text = String::from("Remote locations (PATH as a URL), by store:");
    for store in tensora_remote::schemes() {
        let schemes: Vec<String> = store.schemes.iter().map(|s| format!("{s}://")).collect();
        text.push_str(&format!(
            "\n  {}  {}, e.g. {}\n      --endpoint: {}\n      credentials: {}",
            schemes.join(", "),
            store.store,
            store.example,
            store.endpoint,
            store.credentials
        ));
    }
    text
}

/// `path` as it may be printed: a URL with its password and query values redacted
/// (`tensora_remote::redact`), a local path as it is.
pub fn shown(path: &Path) -> String {
    tensora_remote::redact(&path.to_string_lossy())
}

/// The remote location `path` names, or `None` for a local path (including `file://`).
pub fn location(path: &Path) -> anyhow::Result<Option<Location>> {
    let Some(text) = path.to_str() else { return Ok(None) };
    if !text.contains("://") {
        return Ok(None);
    }
    let location = Location::parse(text)?;
    Ok(location.is_remote().then_some(location))
}

/// Open a remote checkpoint (headers and indexes by ranged reads), printing its warnings.
pub fn open(location: &Location, opts: &RemoteOptions) -> anyhow::Result<RemoteCheckpoint> {
    let remote = open_remote(location, opts)?;
    crate::output::print_warnings(remote.checkpoint());
    Ok(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_remote_urls_are_remote() {
        assert!(location(Path::new("/tmp/x.safetensors")).unwrap().is_none());
        assert!(location(Path::new("file:///tmp/x.safetensors")).unwrap().is_none());
        assert!(location(Path::new("s3://b/m/")).unwrap().is_some());
        assert!(location(Path::new("http://127.0.0.1:1/m.safetensors")).unwrap().is_some());
        for store in tensora_remote::schemes() {
            for scheme in store.schemes {
                assert!(location(Path::new(&format!("{scheme}://b/m/"))).unwrap().is_some(), "{scheme}");
            }
        }
        assert!(location(Path::new("ftp://h/m/")).is_err());
    }

    #[test]
    fn flags_reach_the_store_config() {
        let args = RemoteArgs {
            endpoint: Some("http://127.0.0.1:1".into()),
            allow_http: true,
            anonymous: true,
            allow_unversioned: true,
            open_timeout: Some(std::time::Duration::from_millis(1500)),
            cache: Some("/c".into()),
            offline: true,
            cache_max: Some(10),
            cache_writes: CacheWritesArg::Before,
        };
        let opts = args.options();
        assert_eq!(opts.store.endpoint.as_deref(), Some("http://127.0.0.1:1"));
        assert!(opts.store.allow_http && opts.store.anonymous);
        assert_eq!(opts.unversioned, Unversioned::Allow);
        assert_eq!(opts.open_deadline, std::time::Duration::from_millis(1500));
        assert_eq!(
            opts.cache,
            Some(CacheOptions {
                dir: "/c".into(),
                size_max_bytes: Some(10),
                offline: true,
                writes: CacheWrites::BeforeLanding
            })
        );
        assert_eq!(RemoteArgs::default().options(), RemoteOptions::default());
        assert_eq!(parse_seconds("2.5"), Ok(std::time::Duration::from_millis(2500)));
        assert!(parse_seconds("0").is_err() && parse_seconds("-1").is_err() && parse_seconds("x").is_err());
    }

    /// The help of every command that takes a remote PATH names every scheme of every store,
    /// with what --endpoint means for it and its credentials (from `tensora_remote::schemes()`).
    #[test]
    fn each_remote_command_lists_every_store_in_its_help() {
        use clap::Args as _;
        // The subcommands as clap builds them (named by `subcommand`, which starts no program).
        let subcommand = |name: &'static str| clap::Command::new(name);
        let commands = [
            crate::inspect::Args::augment_args(subcommand("inspect")),
            crate::load::Args::augment_args(subcommand("load")),
            crate::hash::Args::augment_args(subcommand("hash")),
            crate::verify::Args::augment_args(subcommand("verify")),
        ];
        for mut command in commands {
            let help = command.render_long_help().to_string();
            for store in tensora_remote::schemes() {
                for scheme in store.schemes {
                    assert!(
                        help.contains(&format!("{scheme}://")),
                        "{}: no {scheme}:// in\n{help}",
                        command.get_name()
                    );
                }
                assert!(help.contains(store.endpoint) && help.contains(store.credentials), "{help}");
            }
        }
    }
}
