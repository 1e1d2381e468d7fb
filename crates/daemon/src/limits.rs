//! What a client can make the daemon hold, bounded: connections (in all and per user, with a
//! reserve for operators so that `xpreempt list` works while agents fill the rest), queues (in
//! all and per user), devices (ids below a bound), the rate of priority and hint changes per
//! user, and how long a connection may hold a thread without registering anything or finishing
//! a frame it began. Every refusal is counted by its reason (`xpreempt stats`, `/metrics`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The bounds; `xpreempt daemon --help` documents each flag.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections of every role and user together (more are refused at once, except
    /// operators within [`Limits::operator_reserve`]).
    pub connections: usize,
    /// Connections beyond `connections` accepted for operators only (`list`, `stats`, `top`).
    pub operator_reserve: usize,
    /// Connections of one user.
    pub connections_per_uid: usize,
    /// Queues of every user together.
    pub queues: usize,
    /// Queues of one user.
    pub queues_per_uid: usize,
    /// Device ids accepted: `0..devices` (a scheduler is made for each device in use, so an
    /// invented id must not make one).
    pub devices: u32,
    /// Priority and hint changes per second per user (a burst of as many is allowed).
    pub changes_per_sec: u32,
    /// How long a connection that holds no queue or channel group may stay silent.
    pub idle: Duration,
    /// How long a frame, once begun, may take to arrive in full (and a reply to be taken).
    pub frame: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 1024,
            operator_reserve: 32,
            connections_per_uid: 256,
            queues: 4096,
            queues_per_uid: 1024,
            devices: 16,
            changes_per_sec: 1000,
            idle: Duration::from_secs(30),
            frame: Duration::from_secs(5),
        }
    }
}

/// Descriptors one connection may cost the daemon: its socket, its agent's shared segment and
/// the user's board (shared, counted per connection to stay on the safe side).
pub const FDS_PER_CONNECTION: u64 = 3;
/// Descriptors kept for everything else (listeners, logs, MPS, the policy's files).
pub const FDS_SPARE: u64 = 64;

impl Limits {
    /// The connection bound lowered, if need be, to what the process's descriptor limit
    /// allows (raised to its hard limit first), so that the daemon refuses a connection before
    /// `accept` fails for want of descriptors.
    pub fn fit_descriptors(&mut self) {
        // SAFETY: getrlimit/setrlimit on this process with a valid struct.
        let soft = unsafe {
            let mut r: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
                return;
            }
            if r.rlim_cur < r.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: r.rlim_max,
                    rlim_max: r.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    r.rlim_cur = r.rlim_max;
                }
            }
            r.rlim_cur
        };
        let fits =
            soft.saturating_sub(FDS_SPARE + self.operator_reserve as u64) / FDS_PER_CONNECTION;
        if (self.connections as u64) > fits {
            tracing::warn!(
                asked = self.connections,
                allowed = fits,
                nofile = soft,
                "fewer connections than asked: the descriptor limit allows no more"
            );
            self.connections = fits as usize;
        }
    }
}

/// Why something was refused, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Connections,
    ConnectionsPerUid,
    Queues,
    QueuesPerUid,
    Device,
    ChangeRate,
    Idle,
    SlowFrame,
    HelloTimeout,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Connections => "connections",
            Reason::ConnectionsPerUid => "connections_per_uid",
            Reason::Queues => "queues",
            Reason::QueuesPerUid => "queues_per_uid",
            Reason::Device => "device",
            Reason::ChangeRate => "change_rate",
            Reason::Idle => "idle",
            Reason::SlowFrame => "slow_frame",
            Reason::HelloTimeout => "hello_timeout",
        }
    }
}

/// Open connections, in all and per user.
#[derive(Default)]
pub struct Connections {
    total: usize,
    by_uid: BTreeMap<u32, usize>,
}

/// Connections of one user beyond its bound that are kept for its operator commands.
pub const OPERATOR_EXTRA_PER_UID: usize = 4;

/// What a new connection may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Over a bound (the reason) but within the operators' reserve: only an operator may stay.
    OperatorOnly(Reason),
    No(Reason),
}

impl Connections {
    /// Counts a new connection of `uid` in, or says why not (then nothing is counted).
    pub fn admit(&mut self, uid: u32, limits: &Limits) -> Admit {
        let mine = self.by_uid.get(&uid).copied().unwrap_or(0);
        let reserve = self.total < limits.connections + limits.operator_reserve;
        let admit = if mine >= limits.connections_per_uid + OPERATOR_EXTRA_PER_UID {
            Admit::No(Reason::ConnectionsPerUid)
        } else if mine >= limits.connections_per_uid && reserve {
            Admit::OperatorOnly(Reason::ConnectionsPerUid)
        } else if mine >= limits.connections_per_uid {
            Admit::No(Reason::ConnectionsPerUid)
        } else if self.total < limits.connections {
            Admit::Yes
        } else if reserve {
            Admit::OperatorOnly(Reason::Connections)
        } else {
            Admit::No(Reason::Connections)
        };
        if !matches!(admit, Admit::No(_)) {
            self.total += 1;
            *self.by_uid.entry(uid).or_default() += 1;
        }
        admit
    }

    pub fn leave(&mut self, uid: u32) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_uid.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.by_uid.remove(&uid);
            }
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

/// A token bucket per user for priority and hint changes.
#[derive(Default)]
pub struct ChangeRate {
    by_uid: BTreeMap<u32, (f64, Instant)>,
}

impl ChangeRate {
    /// Whether `uid` may make one more change now.
    pub fn take(&mut self, uid: u32, per_sec: u32) -> bool {
        let cap = f64::from(per_sec.max(1));
        let now = Instant::now();
        let (tokens, at) = self.by_uid.entry(uid).or_insert((cap, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * cap).min(cap);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Forgets users whose buckets are full again (so the map holds only recent changers).
    pub fn trim(&mut self, per_sec: u32) {
        let now = Instant::now();
        self.by_uid
            .retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(1) || per_sec == 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_bounded_per_user_and_in_all_with_a_reserve_for_operators() {
        let limits = Limits {
            connections: 3,
            operator_reserve: 1,
            connections_per_uid: 2,
            ..Limits::default()
        };
        let mut c = Connections::default();
        assert_eq!(c.admit(1, &limits), Admit::Yes);
        assert_eq!(c.admit(1, &limits), Admit::Yes);
        // Over the user's bound: only an operator of that user, within the reserve.
        assert_eq!(
            c.admit(1, &limits),
            Admit::OperatorOnly(Reason::ConnectionsPerUid)
        );
        // Over the bound in all: only operators, within the reserve.
        assert_eq!(
            c.admit(2, &limits),
            Admit::OperatorOnly(Reason::Connections)
        );
        assert_eq!(c.admit(3, &limits), Admit::No(Reason::Connections));
        assert_eq!(c.total(), 4);
        for uid in [1, 1, 1, 2] {
            c.leave(uid);
        }
        assert_eq!(c.total(), 0);
        let big = Limits {
            connections: 100,
            operator_reserve: 50,
            connections_per_uid: 2,
            ..Limits::default()
        };
        let kept = (0..100)
            .filter(|_| !matches!(c.admit(9, &big), Admit::No(_)))
            .count();
        assert_eq!(
            kept,
            2 + OPERATOR_EXTRA_PER_UID,
            "one user's bound and its extra"
        );
    }

    #[test]
    fn changes_are_limited_to_their_rate() {
        let mut r = ChangeRate::default();
        let granted = (0..50).filter(|_| r.take(7, 10)).count();
        assert!((10..=11).contains(&granted), "{granted}");
        assert!(r.take(8, 10), "another user has a bucket of its own");
        std::thread::sleep(Duration::from_millis(250));
        assert!(r.take(7, 10), "the bucket refills");
    }
}
