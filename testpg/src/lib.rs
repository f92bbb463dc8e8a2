//! A throwaway PostgreSQL cluster for this test binary: the system's
//! `initdb` and `postgres` (Debian's `postgresql` package) in a temporary
//! directory on a loopback port, one per process, a fresh database per
//! test. Never a shared server, never a download.
//!
//! The server runs under a small shell that waits on a pipe this process
//! holds: when the test binary exits, however it exits, the pipe closes,
//! the shell stops the server and removes its directory.
//!
//! The cluster is the process's: every caller of [`fresh_database`] in one
//! test binary shares it (a database each), which keeps a suite to one
//! server start.
//!
//! Without PostgreSQL installed the tests that need it say so and pass,
//! unless `BATON_REQUIRE_POSTGRES=1` (the README's test command sets it,
//! after installing the package), where its absence fails them.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The running cluster.
struct Cluster {
    port: u16,
    /// The server's directory (its Unix socket is there).
    dir: PathBuf,
    /// The server shell's stdin, held open for the life of the process
    /// (see the module doc), and its stdout (where it says a restart's
    /// stop is done).
    control: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    _shell: Mutex<Child>,
}

static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
static TLS_CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
static DURABLE_CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();

/// How a cluster is set up.
#[derive(Default)]
struct Setup<'a> {
    /// TLS only over TCP.
    tls: Option<Tls<'a>>,
    /// The server's durable defaults (every commit flushed) instead of
    /// the tests' `fsync=off`; its directory under this one.
    durable_in: Option<&'a Path>,
}

/// A server certificate and key (PEM) for a cluster that takes TLS only.
struct Tls<'a> {
    cert: &'a Path,
    key: &'a Path,
}
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// Where the newest installed PostgreSQL keeps `initdb` and `postgres`.
fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

/// `cmd` as the `postgres` user when we are root (the server refuses to
/// run as root).
fn as_server_user(program: &Path, root: bool) -> Command {
    if root {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            "--",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn start(setup: Setup<'_>) -> Result<Cluster, String> {
    let bin =
        bin_dir().ok_or("no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql")?;
    let root = nix::unistd::geteuid().is_root();
    let dir = cluster_dir(&setup);
    make_dir(&dir, root)?;
    let data = dir.join("data");
    initdb(&bin, &data, root)?;
    let settings = match &setup.tls {
        Some(tls) => tls_settings(tls, &data, root)?,
        None => Vec::new(),
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let server = server_args(&bin, root, &data, &dir, port, &setup, &settings);
    let cluster = spawn_server_shell(&bin, root, &server, &dir, port)?;
    cluster.wait_up()?;
    Ok(cluster)
}

/// The cluster's directory: per process, and per kind of cluster.
fn cluster_dir(setup: &Setup<'_>) -> PathBuf {
    setup
        .durable_in
        .map_or_else(std::env::temp_dir, Path::to_path_buf)
        .join(format!(
            "baton-pg-{}{}",
            std::process::id(),
            match (&setup.tls, setup.durable_in) {
                (Some(_), _) => "-tls",
                (None, Some(_)) => "-durable",
                (None, None) => "",
            }
        ))
}

/// Creates `dir` afresh, owned by the server's user when we are root.
fn make_dir(dir: &Path, root: bool) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    if root {
        let user = nix::unistd::User::from_name("postgres")
            .map_err(|e| format!("look up the postgres user: {e}"))?
            .ok_or("no postgres user (is the postgresql package installed?)")?;
        nix::unistd::chown(dir, Some(user.uid), Some(user.gid))
            .map_err(|e| format!("chown {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// A new cluster's files in `data`: user `baton`, trusted, C locale.
fn initdb(bin: &Path, data: &Path, root: bool) -> Result<(), String> {
    let out = as_server_user(&bin.join("initdb"), root)
        .arg("-D")
        .arg(data)
        .args([
            "-U",
            "baton",
            "--auth=trust",
            "--locale=C",
            "-E",
            "UTF8",
            "--no-sync",
        ])
        .output()
        .map_err(|e| format!("run initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// TLS only over TCP: a plaintext TCP client is refused (the Unix socket
/// stays open for this helper's own administration). Installs the
/// certificate and key in `data` and returns the server settings.
fn tls_settings(tls: &Tls<'_>, data: &Path, root: bool) -> Result<Vec<String>, String> {
    let cert = install_private_file(tls.cert, &data.join("server.crt"), root)?;
    let key = install_private_file(tls.key, &data.join("server.key"), root)?;
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
    )
    .map_err(|e| format!("write pg_hba.conf: {e}"))?;
    Ok(vec![
        "ssl=on".to_string(),
        format!("ssl_cert_file={}", cert.display()),
        format!("ssl_key_file={}", key.display()),
    ])
}

/// Copies `from` to `to`, readable by the server's user only.
fn install_private_file(from: &Path, to: &Path, root: bool) -> Result<PathBuf, String> {
    std::fs::copy(from, to).map_err(|e| format!("copy {}: {e}", from.display()))?;
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| e.to_string())?;
    if root {
        let user = nix::unistd::User::from_name("postgres")
            .map_err(|e| e.to_string())?
            .ok_or("no postgres user")?;
        nix::unistd::chown(to, Some(user.uid), Some(user.gid)).map_err(|e| e.to_string())?;
    }
    Ok(to.to_path_buf())
}

/// The server's command-line arguments, shell-quoted (the program itself
/// is `setpriv` when we are root, see [`as_server_user`]).
fn server_args(
    bin: &Path,
    root: bool,
    data: &Path,
    dir: &Path,
    port: u16,
    setup: &Setup<'_>,
    settings: &[String],
) -> String {
    as_server_user(&bin.join("postgres"), root)
        .arg("-D")
        .arg(data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=200",
        ])
        .args(if setup.durable_in.is_some() {
            // A benchmark's cluster counts the statements it is sent.
            &["-c", "shared_preload_libraries=pg_stat_statements"][..]
        } else {
            // Throwaway data: no flush is worth its time.
            &["-c", "fsync=off", "-c", "full_page_writes=off"][..]
        })
        .args(settings.iter().flat_map(|v| ["-c", v.as_str()]))
        .get_args()
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts the server under its shell (see the module doc), which also
/// removes `dir` when it ends. Returns before the server answers.
fn spawn_server_shell(
    bin: &Path,
    root: bool,
    server: &str,
    dir: &Path,
    port: u16,
) -> Result<Cluster, String> {
    let program = if root {
        "setpriv".to_string()
    } else {
        shell_quote(&bin.join("postgres").to_string_lossy())
    };
    // Fast shutdown (SIGINT) once our end of the pipe closes; a line
    // `restart` on it stops the server the same way, says `down` once it
    // has stopped, and starts it again on the same port and files.
    let script = format!(
        "while :; do {program} {server} >>{log} 2>&1 & pid=$!; read cmd; kill -INT $pid; wait $pid; \
         [ \"$cmd\" = restart ] || break; echo down; done; rm -rf {dir}",
        log = shell_quote(&dir.join("server.log").to_string_lossy()),
        dir = shell_quote(&dir.to_string_lossy()),
    );
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start postgres: {e}"))?;
    let stdin = shell
        .stdin
        .take()
        .ok_or("no stdin for the server's shell")?;
    let stdout = shell
        .stdout
        .take()
        .ok_or("no stdout for the server's shell")?;
    Ok(Cluster {
        port,
        dir: dir.to_path_buf(),
        control: Mutex::new((stdin, BufReader::new(stdout))),
        _shell: Mutex::new(shell),
    })
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Cluster {
    /// Returns once the server answers (each try is a connection attempt,
    /// not a sleep standing in for one).
    fn wait_up(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match postgres::Client::connect(&self.admin_url(), postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let log =
                        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                    return Err(format!("postgres did not come up: {e}\n{log}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Stops the server (fast shutdown: every client's connection ends,
    /// committed work stays) and starts it again; returns once it answers.
    fn restart(&self) -> Result<(), String> {
        {
            let mut control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
            let (stdin, stdout) = &mut *control;
            writeln!(stdin, "restart").map_err(|e| format!("ask for a restart: {e}"))?;
            stdin.flush().map_err(|e| e.to_string())?;
            let mut line = String::new();
            stdout
                .read_line(&mut line)
                .map_err(|e| format!("wait for the stop: {e}"))?;
            if line.trim() != "down" {
                return Err(format!("the server's shell said {line:?}, not `down`"));
            }
        }
        self.wait_up()
    }

    fn url(&self, db: &str) -> String {
        format!("host=127.0.0.1 port={} user=baton dbname={db}", self.port)
    }

    /// Over the Unix socket (open on a TLS-only cluster too).
    fn admin_url(&self) -> String {
        format!(
            "host={} port={} user=baton dbname=postgres",
            self.dir.display(),
            self.port
        )
    }

    fn create_database(&self) -> String {
        let name = format!("t{}", NEXT_DB.fetch_add(1, Ordering::Relaxed));
        let mut admin = postgres::Client::connect(&self.admin_url(), postgres::NoTls)
            .expect("connect to the test cluster");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create a test database");
        self.url(&name)
    }
}

fn started(setup: Setup<'_>) -> Option<Cluster> {
    match start(setup) {
        Ok(c) => Some(c),
        Err(e) => {
            baton_testenv::missing(
                "the PostgreSQL tests of this binary",
                Some("BATON_REQUIRE_POSTGRES"),
                &format!("no PostgreSQL cluster: {e}"),
            );
            None
        }
    }
}

/// This process's cluster, started on first use; `None` (having said
/// why) when PostgreSQL is not installed and not required.
fn cluster() -> Option<&'static Cluster> {
    CLUSTER.get_or_init(|| started(Setup::default())).as_ref()
}

/// Whether a cluster runs (starting it if needed). Blocking.
pub fn available() -> bool {
    cluster().is_some()
}

/// The URL of a new, empty database on this process's cluster. Blocking:
/// call it off the async runtime.
pub fn fresh_database() -> Option<String> {
    Some(cluster()?.create_database())
}

/// [`fresh_database`] on a second cluster of this process that takes TLS
/// only over TCP (plaintext clients are refused), serving `cert` and
/// `key` (PEM; the first caller's are kept). Blocking.
pub fn fresh_tls_database(cert: &Path, key: &Path) -> Option<String> {
    TLS_CLUSTER
        .get_or_init(|| {
            started(Setup {
                tls: Some(Tls { cert, key }),
                ..Setup::default()
            })
        })
        .as_ref()
        .map(Cluster::create_database)
}

/// [`fresh_database`] on a third cluster of this process, with the
/// server's durable defaults (`fsync` and `synchronous_commit` on), its
/// files under `dir` (a disk, where a benchmark's figures mean something;
/// `/tmp` may be memory). For benchmarks against the embedded store's
/// `synchronous=FULL`. `pg_stat_statements` is loaded (`CREATE EXTENSION`
/// makes it readable in a database). Blocking.
pub fn durable_database(dir: &Path) -> Option<String> {
    DURABLE_CLUSTER
        .get_or_init(|| {
            started(Setup {
                durable_in: Some(dir),
                ..Setup::default()
            })
        })
        .as_ref()
        .map(Cluster::create_database)
}

/// Restarts this process's cluster (the one [`fresh_database`] uses): a
/// fast shutdown, which ends every client's connection and keeps what was
/// committed, then a start on the same port; returns once it answers.
/// Every database of the cluster goes away meanwhile: a test calling this
/// must not share the cluster with tests running beside it. Blocking.
pub fn restart() {
    let cluster = cluster().expect("the test cluster runs");
    if let Err(e) = cluster.restart() {
        panic!("restart the test cluster: {e}");
    }
}

/// Ends every connection to the database `url` names (as a server restart
/// or a network cut would, for its clients): its clients must notice and
/// connect again. Blocking.
pub fn terminate_connections(url: &str) {
    let cluster = cluster().expect("the test cluster runs");
    let db = url
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("dbname="))
        .expect("a URL from fresh_database");
    let mut admin = postgres::Client::connect(&cluster.admin_url(), postgres::NoTls)
        .expect("connect to the test cluster");
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db],
        )
        .expect("terminate the database's connections");
}
