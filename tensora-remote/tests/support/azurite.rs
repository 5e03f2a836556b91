//! Azurite (Azure Blob Storage's emulator), started as the store's test server.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::{BUCKET, Emulator, PROVISION_HINT, free_port, kill_child, tool_dir, upload_files, wait_ready};

/// Azurite's well-known development account and key (public, documented by Microsoft).
pub const AZURITE_ACCOUNT: (&str, &str) = (
    "devstoreaccount1",
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
);

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
            // No telemetry: its lookups of Azure's ingestion host (unreachable here) held the
            // start up to 19 s on a loaded machine, past READY_TIMEOUT (3 to 5 s without them).
            .arg("--disableTelemetry")
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

impl Emulator for Azurite {
    fn url(&self, prefix: &str) -> String {
        format!("az://{BUCKET}/{prefix}/")
    }

    fn store_config(&self) -> tensora_remote::StoreConfig {
        Azurite::store_config(self)
    }

    fn upload_dir(&self, dir: &Path, prefix: &str) -> Result<(), String> {
        Azurite::upload_dir(self, dir, prefix)
    }
}
