//! Test and bench harness: real nginx and s3rver processes on 127.0.0.1, started on free ports,
//! waited on until they accept connections, and killed on drop; plus generated checkpoints.
//!
//! Every server comes from `cargo xtask provision` (`cargo xtask test` runs it first and points
//! these variables at what it installed; xtask/src/provision has the table):
//! - nginx: the system package nginx-light (`TENSORA_NGINX`, else the usual sbin paths);
//! - s3rver: npm `s3rver@3.7.1` under `target/tensora-remote-s3rver` (`TENSORA_S3RVER_DIR`);
//! - Azurite: npm `azurite@3.35.0` under `target/tensora-remote-azurite` (`TENSORA_AZURITE_DIR`);
//! - gcp-storage-emulator: a venv at `target/tensora-remote-gcs` (`TENSORA_GCS_EMULATOR_DIR`),
//!   started through `gcs_emulator.py`.
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

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
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

/// Azurite's well-known development account and key (public, documented by Microsoft).
pub const AZURITE_ACCOUNT: (&str, &str) = (
    "devstoreaccount1",
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
);

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

/// Azurite (npm `azurite@3.35.0`, blob service only) with one container, [`BUCKET`], data in a
/// temp directory, on 127.0.0.1.
#[derive(Debug)]
pub struct Azurite {
    child: Option<Child>,
    data_dir: tempfile::TempDir,
    pub port: u16,
}

impl Azurite {
    pub fn start() -> Result<Azurite, String> {
        let dir = tool_dir("TENSORA_AZURITE_DIR", "tensora-remote-azurite");
        let script = dir.join("node_modules/azurite/dist/src/blob/main.js");
        if !script.exists() {
            return Err(format!("Azurite not found at {}: {PROVISION_HINT}", script.display()));
        }
        let data_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port();
        let log = data_dir.path().join("azurite.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = Command::new("node")
            .arg(&script)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--silent"])
            .args(["--skipApiVersionCheck", "--loose", "--disableProductStyleUrl"])
            .arg("--location")
            .arg(data_dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run node ({PROVISION_HINT}): {e}"))?;
        wait_ready(&mut child, port, "azurite", &log)?;
        let azurite = Azurite { child: Some(child), data_dir, port };
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(azurite.create_container())?;
        Ok(azurite)
    }

    /// The account URL (path-style, as Azurite serves it).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, AZURITE_ACCOUNT.0)
    }

    /// The store config a client needs for this server.
    pub fn store_config(&self) -> tensora_remote::StoreConfig {
        tensora_remote::StoreConfig {
            endpoint: Some(self.endpoint()),
            allow_http: true,
            credentials: Some((AZURITE_ACCOUNT.0.to_owned(), AZURITE_ACCOUNT.1.to_owned())),
            ..tensora_remote::StoreConfig::default()
        }
    }

    /// Create the container: `PUT /account/container?restype=container`, signed with the
    /// account key (Shared Key): creating a container is not in object_store's API.
    async fn create_container(&self) -> Result<(), String> {
        let (account, key) = AZURITE_ACCOUNT;
        let date = http_date(std::time::SystemTime::now());
        let version = "2021-12-02";
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{account}/{account}/{BUCKET}\nrestype:container"
        );
        let signature = base64_encode(&hmac_sha256(&base64_decode(key)?, to_sign.as_bytes()));
        let headers = format!(
            "x-ms-date: {date}\r\nx-ms-version: {version}\r\nAuthorization: SharedKey {account}:{signature}\r\n"
        );
        let url = format!("{}/{BUCKET}?restype=container", self.endpoint());
        let status = http_put_empty(&url, &headers)?;
        if status != 201 && status != 409 {
            return Err(format!("creating the container: HTTP {status}"));
        }
        Ok(())
    }

    fn store(&self) -> Result<object_store::azure::MicrosoftAzure, String> {
        object_store::azure::MicrosoftAzureBuilder::new()
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_account(AZURITE_ACCOUNT.0)
            .with_access_key(AZURITE_ACCOUNT.1)
            .with_container_name(BUCKET)
            .build()
            .map_err(|e| e.to_string())
    }

    /// Upload every file of `dir` (not recursive) under `prefix/` through the Blob API.
    pub fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String> {
        upload_files(&self.store()?, dir, prefix)
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}

/// One `PUT` with an empty body and `headers` (each line ending in CRLF) over a plain TCP
/// connection (HTTP/1.1); the status code.
fn http_put_empty(url: &str, headers: &str) -> Result<u16, String> {
    use std::io::Read;
    let rest = url.strip_prefix("http://").ok_or("not an http URL")?;
    let (host, path) = rest.split_once('/').ok_or("no path")?;
    let mut stream = TcpStream::connect(host).map_err(|e| e.to_string())?;
    let request = format!(
        "PUT /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n{headers}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let status = response.split_whitespace().nth(1).ok_or("no status line")?;
    status.parse().map_err(|e| format!("status {status:?}: {e}"))
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

/// gcp-storage-emulator (PyPI `gcp-storage-emulator`, in a venv; started through
/// `gcs_emulator.py`) with one bucket, [`BUCKET`], in memory, on 127.0.0.1.
#[derive(Debug)]
pub struct GcsEmulator {
    child: Option<Child>,
    log_dir: tempfile::TempDir,
    pub port: u16,
}

impl GcsEmulator {
    pub fn start() -> Result<GcsEmulator, String> {
        let dir = tool_dir("TENSORA_GCS_EMULATOR_DIR", "tensora-remote-gcs");
        let binary = dir.join("bin/python3");
        let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/gcs_emulator.py");
        if !binary.exists() {
            return Err(format!("gcp-storage-emulator not found at {}: {PROVISION_HINT}", binary.display()));
        }
        let log_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port();
        let log = log_dir.path().join("gcs.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        // The launcher adds the XML API's ETag, Last-Modified, HEAD, preconditions and listing
        // (see gcs_emulator.py), then runs the emulator's own command line.
        let mut child = Command::new(&binary)
            .arg(&launcher)
            .args(["start", "--host", "127.0.0.1", "--port", &port.to_string(), "--in-memory", "--quiet"])
            .args(["--default-bucket", BUCKET])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
        wait_ready(&mut child, port, "gcp-storage-emulator", &log)?;
        Ok(GcsEmulator { child: Some(child), log_dir, port })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The store config a client needs for this server (unsigned requests: the emulator checks
    /// no signature).
    pub fn store_config(&self) -> tensora_remote::StoreConfig {
        tensora_remote::StoreConfig {
            endpoint: Some(self.endpoint()),
            allow_http: true,
            anonymous: true,
            ..tensora_remote::StoreConfig::default()
        }
    }

    /// Upload every file of `dir` (not recursive) under `prefix/`.
    pub fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String> {
        // A service account that turns OAuth off: the emulator checks no token.
        let account = format!(
            r#"{{"gcs_base_url": "{}", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}}"#,
            self.endpoint()
        );
        let store = object_store::gcp::GoogleCloudStorageBuilder::new()
            .with_base_url(&self.endpoint())
            .with_bucket_name(BUCKET)
            .with_service_account_key(account)
            .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
            .build()
            .map_err(|e| e.to_string())?;
        upload_files(&store, dir, prefix)
    }
}

impl Drop for GcsEmulator {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&sha2::Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = sha2::Sha256::digest([pad(0x36), message.to_vec()].concat());
    sha2::Sha256::digest([pad(0x5c), inner.to_vec()].concat()).to_vec()
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= group.len() { BASE64[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = BASE64.iter().position(|&a| a == c).ok_or("not base64")? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// An RFC 1123 date (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let name = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        [(month - 1) as usize];
    format!("{weekday}, {day:02} {name} {year} {:02}:{:02}:{:02} GMT", rem / 3600, rem % 3600 / 60, rem % 60)
}
