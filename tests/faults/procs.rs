//! `hookline` child processes of a scenario: `run all`, or one stage per process (several of a
//! stage when a group is scaled), each with its own log file, killed with SIGKILL or stopped
//! with SIGTERM the way an orchestrator does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::harness;

/// `hookline --config <config>` with a clean `HOOKLINE_*` environment (a variable of the test
/// runner's would be read as a config override) and the test binary's endpoint secrets key.
pub fn hookline_command(config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOOKLINE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOOKLINE_SECRETS_KEY", harness::secrets_key());
    cmd.arg("--config").arg(config);
    cmd
}

/// One `hookline run …` child; its stderr is appended to `<config dir>/<name>.log`, so a process
/// restarted under the same name keeps one log.
pub struct Hookline {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Hookline {
    /// `hookline run all`.
    pub fn all(config: &Path) -> Hookline {
        Hookline::spawn(config, "all", &["all"], &[])
    }

    /// `hookline run <args…>` named `name`, with extra environment (e.g. a
    /// `HOOKLINE_KAFKA__INSTANCE_ID` per process, or a fake clock).
    pub fn spawn(config: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Hookline {
        let log = config.with_file_name(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let mut cmd = hookline_command(config);
        cmd.arg("run").args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn hookline run {args:?}: {e}"));
        Hookline {
            name: name.to_owned(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails the test if the process has exited: a fault of Kafka's must never cost a restart.
    pub fn assert_running(&mut self, during: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "hookline {} exited ({status}) during {during}; last log lines:\n{}",
                self.name,
                self.tail(40)
            );
        }
    }

    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as the OOM killer or a node loss does; waits until it is gone.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit; fails the test unless it exits 0 within 60 s.
    pub fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.success(),
            "hookline {} stopped with {status}; last log lines:\n{}",
            self.name,
            self.tail(40)
        );
    }

    fn terminate(&mut self) -> ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!(
            "hookline {} did not stop within 60 s of SIGTERM; last log lines:\n{}",
            self.name,
            self.tail(40)
        );
    }
}

impl Drop for Hookline {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Watches `procs` for `secs` seconds, failing the test as soon as one has exited.
pub fn watch(procs: &mut [&mut Hookline], what: &str, secs: f64) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < until {
        for p in procs.iter_mut() {
            p.assert_running(what);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
