//! A real single-member etcd on free loopback ports, in a temp directory: started, stopped and
//! restarted on the same data by the test, killed when dropped. `ETCD_BIN` names the binary
//! (default `etcd` on `PATH`; the test command installs Debian's `etcd-server`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, until};

pub struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Etcd {
    pub async fn start() -> Etcd {
        let mut etcd = Etcd {
            client_port: free_port(),
            peer_port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        etcd.restart().await;
        etcd
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The `registry` configuration of a replica sharing this etcd under `prefix`. The request
    /// timeout is generous for a loaded machine; a stopped etcd refuses connections at once.
    pub fn registry(&self, prefix: &str) -> serde_json::Value {
        serde_json::json!({"etcd": {
            "endpoints": [self.endpoint()], "prefix": prefix, "request_timeout_ms": 5000,
        }})
    }

    /// Start (again, on the same data and ports) and wait until it answers, at most 20 s.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd log");
        let child = Command::new(&bin)
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--log-outputs", "stderr"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {bin} ({e}); install etcd (Debian: etcd-server) or set ETCD_BIN"
                )
            });
        self.child = Some(child);
        until(Duration::from_secs(20), async || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("etcd exited with {status}:\n{}", self.log());
            }
            let health = super::http::try_request(self.client_port, "GET", "/health", &[], b"");
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(1), health).await
                && r.status == 200
                && r.text().contains("true")
            {
                return Ok(());
            }
            Err(format!("waiting for etcd to be healthy:\n{}", self.log()))
        })
        .await;
    }

    /// Stop it (SIGKILL: an outage, not a goodbye); the data stays for [`Etcd::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stop it, delete its data and start a new, empty etcd on the same ports and member name:
    /// what a wiped or freshly reinstalled etcd looks like to its clients (a single member
    /// started with the same flags even gets the same cluster id).
    pub async fn wipe(&mut self) {
        self.stop();
        std::fs::remove_dir_all(self.dir.path().join("data")).expect("delete etcd data");
        self.restart().await;
    }

    /// etcd's current store revision (its JSON gateway's answer to an empty range).
    pub async fn revision(&self) -> i64 {
        let body = br#"{"key": "AA=="}"#;
        let r = super::http::request(self.client_port, "POST", "/v3/kv/range", &[], body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let header = &r.json()["header"]["revision"];
        // The gateway writes 64-bit numbers as strings.
        header
            .as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| header.as_i64())
            .unwrap_or_else(|| panic!("no revision in {}", r.text()))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
