//! A PostgreSQL cluster of the test's own, which it may stop and start (the shared one at
//! 127.0.0.1:5432 is never stopped): `initdb` into a temporary directory, `pg_ctl` on a
//! free loopback port, with the Debian binaries under /usr/lib/postgresql/*/bin. When the
//! tests run as root the cluster runs as the `postgres` user (PostgreSQL refuses root).
//! Needs: those binaries (or LEVEE_TEST_PG_BIN naming their directory).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private cluster; stopped (immediately) and removed on drop.
pub struct PrivatePg {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    run_as_postgres: bool,
}

fn find_bin() -> Option<PathBuf> {
    if let Ok(b) = std::env::var("LEVEE_TEST_PG_BIN") {
        return Some(PathBuf::from(b));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PrivatePg {
    /// initdb + start. None when no PostgreSQL binaries are installed (the test is then
    /// skipped, unless LEVEE_REQUIRE_POSTGRES is set: then it fails).
    pub fn start() -> Option<PrivatePg> {
        let Some(bin) = find_bin() else {
            assert!(
                std::env::var("LEVEE_REQUIRE_POSTGRES").is_err(),
                "LEVEE_REQUIRE_POSTGRES is set but no PostgreSQL binaries (initdb, pg_ctl) were found"
            );
            eprintln!("no PostgreSQL binaries: skipping a test that stops its own PostgreSQL");
            return None;
        };
        let run_as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        let dir = tempfile::Builder::new().prefix("levee-pg-").tempdir().unwrap();
        let pg = PrivatePg { bin, dir, port: free_port(), run_as_postgres };
        if run_as_postgres {
            let ok = Command::new("chown").arg("postgres").arg(pg.dir.path()).status().unwrap().success();
            assert!(ok, "chown of the cluster directory to postgres");
        }
        pg.run(
            "initdb",
            &["-D", &pg.data().to_string_lossy(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"],
        );
        pg.start_again();
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let out = if self.run_as_postgres {
            Command::new("runuser").arg("-u").arg("postgres").arg("--").arg(&exe).args(args).output()
        } else {
            Command::new(&exe).args(args).output()
        }
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// URL of database `postgres` (the server's own database in these tests).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on.
    #[allow(dead_code)]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts it (again), on the same port, and waits until it accepts connections.
    pub fn start_again(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200{}",
            self.port,
            self.dir.path().display(),
            self.ssl_opts()
        );
        let log = self.dir.path().join("log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().to_string_lossy(),
                "-o",
                &opts,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
    }

    fn ssl_opts(&self) -> String {
        if self.data().join("server.crt").exists() { " -c ssl=on".into() } else { String::new() }
    }

    /// Stops it: `fast` ends every client connection at once, as a database failover
    /// does.
    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data().to_string_lossy(), "-m", "fast", "-w", "-t", "30", "stop"]);
    }

    /// Gives the cluster a self-signed certificate, so the next start serves TLS.
    #[allow(dead_code)]
    pub fn enable_tls(&self) {
        let data = self.data();
        let ok = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
            .arg("-keyout")
            .arg(data.join("server.key"))
            .arg("-out")
            .arg(data.join("server.crt"))
            .output()
            .expect("openssl runs")
            .status
            .success();
        assert!(ok, "openssl made a certificate");
        if self.run_as_postgres {
            for f in ["server.key", "server.crt"] {
                assert!(Command::new("chown").arg("postgres").arg(data.join(f)).status().unwrap().success());
            }
        }
        set_mode(&data.join("server.key"));
    }
}

fn set_mode(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let exe = self.bin.join("pg_ctl");
        let data = self.data();
        let args = ["-D", &*data.to_string_lossy(), "-m", "immediate", "-w", "stop"].map(str::to_string);
        let _ = if self.run_as_postgres {
            Command::new("runuser").arg("-u").arg("postgres").arg("--").arg(&exe).args(&args).output()
        } else {
            Command::new(&exe).args(&args).output()
        };
    }
}
