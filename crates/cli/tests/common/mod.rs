//! What the tests that run real client processes share: the client is the test binary itself,
//! run again with one test selected and a role in its environment.
// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct Client {
    child: Child,
    pub stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    /// This test binary's test `child`, with `role_var=role` in its environment.
    pub fn start(role_var: &str, role: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child",
                "--nocapture",
                "--test-threads=1",
                "--quiet",
            ])
            .env(role_var, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the client starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Waits for the client to say `what` (the harness prints lines of its own around it).
    pub fn expect(&mut self, what: &str) {
        loop {
            let mut s = String::new();
            assert_ne!(
                self.stdout.read_line(&mut s).unwrap(),
                0,
                "the client ended before saying {what}"
            );
            if s.trim() == what {
                return;
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `xpreempt --json ARGS --socket SOCK`, run as a user runs it.
pub fn cli(args: &[&str], sock: &Path) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .arg("--json")
        .args(args)
        .args(["--socket", sock.to_str().unwrap()])
        .output()
        .expect("run xpreempt");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// The daemon's `/metrics` answer, head and body.
pub fn scrape(addr: SocketAddr) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    text
}
