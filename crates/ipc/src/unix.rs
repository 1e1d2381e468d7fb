//! Unix-socket extras the standard library lacks: passing a descriptor (`SCM_RIGHTS`) and the
//! peer's credentials (`SO_PEERCRED`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Who is at the other end of a connection, as the kernel saw it at `connect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Cred {
    /// Whether this peer may change queues owned by `owner`: its own, another process of the
    /// same user, or anything when it is root.
    pub fn may_change(&self, owner: &Cred) -> bool {
        self.uid == 0 || self.uid == owner.uid
    }
}

pub fn peer_cred(stream: &UnixStream) -> io::Result<Cred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(SO_PEERCRED) writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Cred {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Connects within `limit`, or fails with `ErrorKind::TimedOut`. A plain `connect` blocks for as
/// long as the listener's backlog is full (a daemon stopped or too busy to accept); here the
/// socket is non-blocking and a full backlog (`EAGAIN`) is tried again until the limit.
pub fn connect_within(path: &Path, limit: Duration) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let deadline = Instant::now() + limit;
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid empty address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long for a Unix socket",
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    loop {
        // SAFETY: `addr` is a valid sockaddr_un that outlives the call.
        let r = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Some(libc::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the daemon accepts no connection (its backlog stayed full for {} ms)",
                        limit.as_millis()
                    ),
                ));
            }
            _ => return Err(e),
        }
    }
    stream.set_nonblocking(false)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))?;
    Ok(stream)
}

/// Whether an I/O error is a timeout of [`connect_within`] or of a read or write timeout.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// Space for one descriptor's control message.
const CMSG_SPACE: usize = 24;

/// A message of one byte (`iov`) with `control_len` bytes of `control` for one descriptor.
fn one_byte_message(
    iov: &mut libc::iovec,
    control: &mut [u8; CMSG_SPACE],
    control_len: usize,
) -> libc::msghdr {
    // SAFETY: msghdr is plain data, for which all zeroes is a valid, empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_len.min(CMSG_SPACE);
    msg
}

/// Sends one descriptor with a one-byte message.
pub fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u8; CMSG_SPACE];
    // SAFETY: every pointer in `msg` outlives the sendmsg call, and the control buffer holds
    // one SCM_RIGHTS descriptor (CMSG_SPACE(sizeof(int)) = 24 on Linux).
    unsafe {
        let space = libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
        debug_assert!(space <= CMSG_SPACE);
        let msg = one_byte_message(&mut iov, &mut control, space);
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd.as_raw_fd());
        if libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives the descriptor [`send_fd`] sent.
pub fn recv_fd(stream: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u8; CMSG_SPACE];
    // SAFETY: as in send_fd; the received descriptor is new to this process and owned here
    // (MSG_CMSG_CLOEXEC keeps it from leaking into children).
    unsafe {
        let mut msg = one_byte_message(&mut iov, &mut control, CMSG_SPACE);
        let n = libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if n == 0
            || cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "expected a descriptor from the daemon",
            ));
        }
        let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
        Ok(OwnedFd::from_raw_fd(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_connection_to_a_full_backlog_gives_up_in_time() {
        let dir = std::env::temp_dir().join(format!("xpreempt-ipc-backlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Never accepted: the backlog fills, after which a blocking connect would wait for ever.
        let mut held = Vec::new();
        let t = Instant::now();
        let err = loop {
            match connect_within(&path, Duration::from_millis(50)) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 100_000, "the backlog never filled");
        };
        assert!(is_timeout(&err), "{err}");
        assert!(t.elapsed() < Duration::from_secs(30));
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn credentials_and_descriptors_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let me = peer_cred(&a).unwrap();
        assert_eq!(me.pid, std::process::id());
        let seg = crate::shm::Segment::create(4).unwrap();
        send_fd(&a, seg.fd()).unwrap();
        let got = recv_fd(&b).unwrap();
        let other = crate::shm::Segment::open(got).unwrap();
        assert_eq!(other.slots(), 4);
        let _ = seg.fd().as_fd();
    }

    #[test]
    fn only_the_same_user_or_root_may_change_queues() {
        let owner = Cred {
            pid: 10,
            uid: 1000,
            gid: 1000,
        };
        let same_user = Cred { pid: 11, ..owner };
        let root = Cred {
            pid: 12,
            uid: 0,
            gid: 0,
        };
        let stranger = Cred {
            pid: 13,
            uid: 1001,
            gid: 1000,
        };
        assert!(owner.may_change(&owner));
        assert!(same_user.may_change(&owner));
        assert!(root.may_change(&owner));
        assert!(!stranger.may_change(&owner), "same group is not enough");
    }
}
