//! Test and bench harness: real nginx and s3rver processes on 127.0.0.1, started on free ports,
//! waited on until they accept connections, and killed on drop; plus generated checkpoints.
//!
//! Every server comes from `cargo xtask provision` (`cargo xtask test` runs it first and points
//! these variables at what it installed; xtask/src/provision has the table):
//! - nginx: the system package nginx-light (`TENSORA_NGINX`, else the usual sbin paths);
//! - every other store's emulator (one file here each, and one line in [`stores`]): its entry in
//!   the provisioning's `TOOLS` (package, pinned version, directory under `target/`, variable).
//!
//! Every server listens on 127.0.0.1 only.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use tensora_format::Dtype;
use tensora_format::write::{ShardedLayout, TensorSpec, write_sharded};

mod azurite;
mod gcs;

// Not every test binary (nor the bench example) that includes this harness uses each.
#[allow(unused_imports)]
pub use azurite::{AZURITE_ACCOUNT, Azurite};
#[allow(unused_imports)]
pub use gcs::GcsEmulator;

/// One store's test server on 127.0.0.1, as the store-parametrised tests (`tests/remote.rs`)
/// use it: every store of `tensora_remote::schemes()` has one in [`stores`].
pub trait Emulator {
    /// The store's URL of `prefix/` on this server (`s3://tensora/m/`).
    fn url(&self, prefix: &str) -> String;
    /// What a client needs to reach it.
    fn store_config(&self) -> tensora_remote::StoreConfig;
    /// Put every file of `dir` (not recursive) under `prefix/`, replacing what is there (a
    /// replaced object gets another version).
    fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String>;
}

/// One store's test server: the report name of the store it serves and how to start it.
pub struct StoreServer {
    /// The store's backend name (`tensora_remote::Scheme::backend`).
    pub backend: &'static str,
    /// Start it (a missing server fails with the line that installs it).
    pub start: fn() -> Result<Box<dyn Emulator>, String>,
}

/// Every store's test server, one line per store: a new store adds its line here and no test
/// code (tests/remote.rs fails while a store of `tensora_remote::schemes()` has none).
pub fn stores() -> Vec<StoreServer> {
    vec![
        StoreServer { backend: "remote-http", start: || Ok(Box::new(NginxRoot::start()?)) },
        StoreServer { backend: "remote-s3", start: || Ok(Box::new(S3rver::start()?)) },
        StoreServer { backend: "remote-azure", start: || Ok(Box::new(Azurite::start()?)) },
        StoreServer { backend: "remote-gcs", start: || Ok(Box::new(GcsEmulator::start()?)) },
    ]
}

/// How long a server gets to start accepting connections.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// The bucket s3rver is started with.
pub const BUCKET: &str = "tensora";
/// s3rver's default credentials.
pub const S3RVER_KEY: (&str, &str) = ("S3RVER", "S3RVER");

/// The longest a test waits for an event (a server's log line, a file, a connection) before
/// failing: a bound against hangs, far beyond what any working run takes; no test asserts on time.
pub const EVENT_WAIT_MAX: Duration = Duration::from_secs(120);

/// Poll `ready` every few milliseconds until it holds; panics naming `what` after
/// [`EVENT_WAIT_MAX`].
pub fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + EVENT_WAIT_MAX;
    while !ready() {
        assert!(Instant::now() < deadline, "no {what} within {EVENT_WAIT_MAX:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kill a server (SIGKILL) and reap it; its open connections are reset.
fn kill_child(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A free TCP port on 127.0.0.1 (bound once, then released for the server to take).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn wait_ready(child: &mut Child, port: u16, what: &str, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{what} exited with {status} before listening on {port}: {log}"));
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not listen on 127.0.0.1:{port} within {READY_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this process runs as root: its effective user id is 0, read as the owner of
/// `/proc/self` (Linux gives each process's directory there the task's effective user, dumpable
/// or not: `task_dump_owner` in fs/proc/base.c). Not `libc::geteuid`: tensora-cli's tests compile
/// this file too, and libc is no dependency of theirs.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    Path::new("/proc/self").metadata().is_ok_and(|m| m.uid() == 0)
}

fn nginx_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TENSORA_NGINX") {
        return Ok(PathBuf::from(p));
    }
    for p in ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return Ok(PathBuf::from(p));
        }
    }
    Err(format!("nginx not found: {PROVISION_HINT} (it installs nginx-light, or names the command)"))
}

/// nginx serving `root` on two ports: `port` at full speed, `slow_port` with `limit_rate` per
/// connection. One process (`master_process off`), so killing it stops the server at once.
#[derive(Debug)]
pub struct Nginx {
    child: Option<Child>,
    conf_dir: tempfile::TempDir,
    pub root: PathBuf,
    pub port: u16,
    pub slow_port: u16,
}

impl Nginx {
    /// Start nginx on `root` with `limit_rate` (nginx syntax, e.g. `50m`) on the slow port.
    pub fn start(root: &Path, limit_rate: &str) -> Result<Nginx, String> {
        let conf_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (port, slow_port) = (free_port(), free_port());
        let d = conf_dir.path().display();
        let r = root.display();
        let user = if is_root() { "user root;" } else { "" };
        // Both servers answer every request with the status of a `status-NNN` flag file while
        // one exists (`Nginx::fail_with`; 503 and 429 with `Retry-After: 1`), log each request's
        // status to `access.log` (`Nginx::wait_for_status`), and ask for basic auth (user `u`,
        // password `hunter2`) under `/private/`.
        let statuses = "if (-f {d}/slow) { set $limit_rate 16k; }\n\
             if (-f {d}/status-500) { return 500; }\n\
             if (-f {d}/status-503) { add_header Retry-After 1 always; return 503; }\n\
             if (-f {d}/status-429) { add_header Retry-After 1 always; return 429; }\n"
            .replace("{d}", &d.to_string());
        let locations = format!(
            "location / {{ {statuses} }}\n\
             location /private/ {{ auth_basic \"tensora\"; auth_basic_user_file {d}/htpasswd; {statuses} }}\n"
        );
        let conf = format!(
            "{user}\ndaemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\nhttp {{\n\
             log_format statuses '$status $request_method $uri';\naccess_log {d}/access.log statuses;\n\
             sendfile on;\ntcp_nopush on;\nkeepalive_requests 1000000;\n\
             client_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\nfastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\ndefault_type application/octet-stream;\n\
             server {{ listen 127.0.0.1:{port}; root {r}; {locations} }}\n\
             server {{ listen 127.0.0.1:{slow_port}; root {r}; limit_rate {limit_rate}; {locations} }}\n}}\n"
        );
        std::fs::write(conf_dir.path().join("nginx.conf"), conf).map_err(|e| e.to_string())?;
        std::fs::write(conf_dir.path().join("htpasswd"), "u:{PLAIN}hunter2\n").map_err(|e| e.to_string())?;
        let mut nginx = Nginx { child: None, conf_dir, root: root.to_path_buf(), port, slow_port };
        nginx.restart()?;
        Ok(nginx)
    }

    /// Start (again) with the same configuration and ports.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let binary = nginx_binary()?;
        let d = self.conf_dir.path();
        let mut child = Command::new(&binary)
            .arg("-p")
            .arg(d)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .arg("-e")
            .arg(d.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e} ({PROVISION_HINT})", binary.display()))?;
        let log = d.join("error.log");
        wait_ready(&mut child, self.port, "nginx", &log)?;
        wait_ready(&mut child, self.slow_port, "nginx", &log)?;
        self.child = Some(child);
        Ok(())
    }

    /// Kill the server (SIGKILL) and reap it; open connections are reset.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// Answer every request with `status` from now on (500, 503 or 429), or serve files again
    /// (`None`).
    pub fn fail_with(&self, status: Option<u16>) {
        for code in [500, 503, 429] {
            let flag = self.conf_dir.path().join(format!("status-{code}"));
            if status == Some(code) {
                std::fs::write(&flag, b"").expect("write the status flag");
            } else {
                let _ = std::fs::remove_file(&flag);
            }
        }
    }

    /// Send every response begun from now on at 16 KiB/s (`true`), or at full speed again.
    /// nginx sends a second's worth at once, so a 64 KiB range takes about 3 s: slower than a
    /// test's polling by far (at 64 KiB/s a 64 KiB range went out at once, and a whole test
    /// checkpoint could land between two polls).
    pub fn set_slow(&self, slow: bool) {
        let flag = self.conf_dir.path().join("slow");
        if slow {
            std::fs::write(&flag, b"").expect("write the slow flag");
        } else {
            let _ = std::fs::remove_file(&flag);
        }
    }

    /// Requests answered with `status` so far (nginx logs each as it finishes).
    pub fn count_status(&self, status: u16) -> usize {
        self.count_logged(&format!("{status} "))
    }

    /// Requests whose access-log line (`STATUS METHOD URI`) starts with `prefix`.
    pub fn count_logged(&self, prefix: &str) -> usize {
        let log = std::fs::read_to_string(self.conf_dir.path().join("access.log")).unwrap_or_default();
        log.lines().filter(|l| l.starts_with(prefix)).count()
    }

    /// Block until nginx has answered `count` requests with `status`: an event the server
    /// signals, polled every few milliseconds. Fails after [`EVENT_WAIT_MAX`], a bound on a hang,
    /// never reached by a working load.
    pub fn wait_for_status(&self, status: u16, count: usize) {
        wait_for(&format!("{count} responses with status {status}"), || self.count_status(status) >= count);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    pub fn slow_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.slow_port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.kill();
    }
}

/// nginx serving a temporary directory of its own: the HTTP store's [`Emulator`].
pub struct NginxRoot {
    nginx: Nginx,
    root: tempfile::TempDir,
}

impl NginxRoot {
    pub fn start() -> Result<NginxRoot, String> {
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        Ok(NginxRoot { nginx: Nginx::start(root.path(), "50m")?, root })
    }
}

impl Emulator for NginxRoot {
    fn url(&self, prefix: &str) -> String {
        self.nginx.url(&format!("{prefix}/"))
    }

    fn store_config(&self) -> tensora_remote::StoreConfig {
        tensora_remote::StoreConfig::default()
    }

    /// Copies the files in; a replaced file gets a modification time 100 s later than the one it
    /// replaces (nginx's ETag is made of the time in seconds and the size).
    fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String> {
        let to = self.root.path().join(prefix);
        std::fs::create_dir_all(&to).map_err(|e| e.to_string())?;
        for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
            let target = to.join(entry.file_name());
            let tmp = to.join(".upload.tmp");
            std::fs::copy(entry.path(), &tmp).map_err(|e| e.to_string())?;
            if let Ok(old) = std::fs::metadata(&target).and_then(|m| m.modified()) {
                let later = old + Duration::from_secs(100);
                let file = std::fs::File::options().write(true).open(&tmp).map_err(|e| e.to_string())?;
                file.set_modified(later).map_err(|e| e.to_string())?;
            }
            std::fs::rename(&tmp, &target).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Emulator for S3rver {
    fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}/")
    }

    fn store_config(&self) -> tensora_remote::StoreConfig {
        S3rver::store_config(self)
    }

    fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String> {
        S3rver::upload_dir(self, dir, prefix)
    }
}

/// s3rver's entry point, where the provisioning put it.
fn s3rver_script() -> PathBuf {
    tool_dir("TENSORA_S3RVER_DIR", "tensora-remote-s3rver").join("node_modules/s3rver/bin/s3rver.js")
}

/// s3rver (npm `s3rver@3.7.1`) with one bucket, [`BUCKET`], data in a temp directory.
#[derive(Debug)]
pub struct S3rver {
    child: Option<Child>,
    data_dir: tempfile::TempDir,
    pub port: u16,
}

impl S3rver {
    pub fn start() -> Result<S3rver, String> {
        let script = s3rver_script();
        if !script.exists() {
            return Err(format!("s3rver not found at {}: {PROVISION_HINT}", script.display()));
        }
        let data_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut s3 = S3rver { child: None, data_dir, port: free_port() };
        s3.restart_with(&script)?;
        Ok(s3)
    }

    fn restart_with(&mut self, script: &Path) -> Result<(), String> {
        self.kill();
        let log = self.data_dir.path().join("s3rver.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = Command::new("node")
            .arg(script)
            .arg("-d")
            .arg(self.data_dir.path().join("data"))
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "--silent"])
            .args(["--allow-mismatched-signatures", "--configure-bucket", BUCKET])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run node ({PROVISION_HINT}): {e}"))?;
        wait_ready(&mut child, self.port, "s3rver", &log)?;
        self.child = Some(child);
        Ok(())
    }

    pub fn restart(&mut self) -> Result<(), String> {
        self.restart_with(&s3rver_script())
    }

    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The store config a client needs for this server.
    pub fn store_config(&self) -> tensora_remote::StoreConfig {
        tensora_remote::StoreConfig {
            endpoint: Some(self.endpoint()),
            allow_http: true,
            anonymous: false,
            region: Some("us-east-1".to_owned()),
            credentials: Some((S3RVER_KEY.0.to_owned(), S3RVER_KEY.1.to_owned())),
        }
    }

    /// Upload every file of `dir` (not recursive) under `prefix/` through the S3 API.
    pub fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String> {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id(S3RVER_KEY.0)
            .with_secret_access_key(S3RVER_KEY.1)
            .build()
            .map_err(|e| e.to_string())?;
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(entry.path()).map_err(|e| e.to_string())?;
            let key = object_store::path::Path::from(format!("{prefix}/{name}"));
            rt.block_on(store.put(&key, bytes.into())).map_err(|e| format!("upload {key}: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for S3rver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SplitMix64, for reproducible tensor bytes.
pub fn fill_bytes(seed: u64, out: &mut [u8]) {
    let mut state = seed;
    for chunk in out.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

/// Write a sharded checkpoint into `dir`: `shards` shards of `tensors_per_shard` F32 tensors of
/// `tensor_bytes` each (a multiple of 4), plus `model.safetensors.index.json`.
pub fn write_checkpoint(dir: &Path, shards: usize, tensors_per_shard: usize, tensor_bytes: u64) {
    let specs: Vec<TensorSpec> = (0..shards * tensors_per_shard)
        .map(|i| TensorSpec {
            name: format!("layers.{i}.weight"),
            dtype: Dtype::F32,
            shape: vec![tensor_bytes / 4],
        })
        .collect();
    let shard_cap = tensor_bytes * tensors_per_shard as u64;
    let layout = ShardedLayout::new(specs, BTreeMap::new(), shard_cap).expect("layout");
    let mut buf = vec![0u8; tensor_bytes as usize];
    write_sharded(dir, &layout, |i, out: &mut dyn Write| {
        fill_bytes(i as u64 + 1, &mut buf);
        out.write_all(&buf)
    })
    .expect("write sharded checkpoint");
}

/// How a missing server is installed.
const PROVISION_HINT: &str = "run `cargo xtask provision` (as `cargo xtask test` does)";

/// Where the provisioning put a tool: `var`, else `default` under `$CARGO_TARGET_DIR` (relative to
/// the workspace root) or the workspace's `target/` (xtask/src/provision: the same rule and table).
fn tool_dir(var: &str, default: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    match (std::env::var_os(var), std::env::var_os("CARGO_TARGET_DIR")) {
        (Some(d), _) => root.join(d),
        (None, Some(target)) => root.join(target).join(default),
        (None, None) => root.join("target").join(default),
    }
}

/// Every file of `dir` (sorted, not recursive) put under `prefix/` in `store`.
fn upload_files(store: &dyn object_store::ObjectStore, dir: &Path, prefix: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(entry.path()).map_err(|e| e.to_string())?;
        let key = object_store::path::Path::from(format!("{prefix}/{name}"));
        rt.block_on(store.put(&key, bytes.into())).map_err(|e| format!("upload {key}: {e}"))?;
    }
    Ok(())
}
