//! Unix-socket extras the standard library lacks: passing a descriptor (`SCM_RIGHTS`) and the
//! peer's credentials (`SO_PEERCRED`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

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
