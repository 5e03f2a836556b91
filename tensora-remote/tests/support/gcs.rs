//! gcp-storage-emulator (Google Cloud Storage), started as the store's test server.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::{BUCKET, Emulator, PROVISION_HINT, free_port, kill_child, tool_dir, upload_files, wait_ready};

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

impl Emulator for GcsEmulator {
    fn url(&self, prefix: &str) -> String {
        format!("gs://{BUCKET}/{prefix}/")
    }

    fn store_config(&self) -> tensora_remote::StoreConfig {
        GcsEmulator::store_config(self)
    }

    fn upload_dir(&self, dir: &std::path::Path, prefix: &str) -> Result<(), String> {
        GcsEmulator::upload_dir(self, dir, prefix)
    }
}
