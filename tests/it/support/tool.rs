//! The binary's fixture commands (`record`, `play`, `check`) as child processes, each bounded in
//! time: a command still running at its deadline is killed and fails the test.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{eventually_blocking, poll};

pub struct Tool {
    child: Option<Child>,
    what: String,
}

impl Tool {
    /// A child started elsewhere, killed if the test ends before it exits.
    pub fn from_child(child: Child, what: &str) -> Tool {
        Tool {
            child: Some(child),
            what: what.to_owned(),
        }
    }

    pub fn spawn(args: &[&str]) -> Tool {
        let child = Command::new(env!("CARGO_BIN_EXE_mooncake_conductor"))
            .args(args)
            // No configuration is read by these commands; an unreadable one proves it.
            .env("CONDUCTOR_CONFIG_PATH", "/nonexistent/conductor.json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mooncake_conductor");
        Tool {
            child: Some(child),
            what: args.join(" "),
        }
    }

    /// Wait for the exit, at most `timeout`.
    pub async fn finish(mut self, timeout: Duration) -> Output {
        let mut child = self.child.take().expect("not finished yet");
        let exited = poll(timeout, async || {
            child.try_wait().expect("poll child").ok_or(())
        })
        .await;
        if exited.is_err() {
            let _ = child.kill();
            let out = child.wait_with_output().expect("child output");
            panic!(
                "`{}` still ran after {timeout:?}; stderr:\n{}",
                self.what,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        child.wait_with_output().expect("child output")
    }
}

impl Tool {
    /// [`Tool::finish`] for synchronous tests: a command still running at `timeout` fails the
    /// test (and is killed on the way out).
    pub fn finish_blocking(mut self, timeout: Duration) -> Output {
        let what = format!("`{}` to exit", self.what);
        let child = self.child.as_mut().expect("not finished yet");
        eventually_blocking(&what, timeout, || child.try_wait().expect("poll child"));
        let child = self.child.take().expect("not finished yet");
        child.wait_with_output().expect("child output")
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Run a command to its end, at most `timeout`.
pub async fn run(args: &[&str], timeout: Duration) -> Output {
    Tool::spawn(args).finish(timeout).await
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
