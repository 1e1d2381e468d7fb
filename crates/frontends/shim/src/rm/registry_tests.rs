//! The channel-group registry: which process owns it, what RM frees and closed fds make it
//! forget (even while it is busy), reused fd numbers, and a forked child that never waits for it.

use super::*;

/// Waits for child `pid` for at most `patience`; its exit code, or `None` if it had to be
/// killed or did not exit normally.
fn exit_code_within(pid: libc::pid_t, patience: std::time::Duration) -> Option<i32> {
    let since = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if since.elapsed() > patience {
            // SAFETY: our own child, stuck.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_forked_child_never_waits_for_the_registry_a_parent_thread_held() {
    let _serial = crate::cuda::fork_gate::FORK_TESTS
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // A thread of the parent (libcuda's, finishing an RM call) has the registry at the fork.
    let holder = std::thread::spawn(move || {
        let _g = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        held_tx.send(()).expect("send");
        let _ = done_rx.recv();
    });
    held_rx.recv().expect("the holder took the registry");
    claim_owner();
    // SAFETY: the child calls what its exit path may call, then leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = xpreempt_shim_channel_groups() == 0
            && xpreempt_shim_set_timeslice(1) == -(libc::ENODEV as i64);
        // SAFETY: leaving the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0, "fork failed");
    let code = exit_code_within(pid, std::time::Duration::from_secs(10));
    done_tx.send(()).expect("send");
    holder.join().expect("join");
    assert_eq!(
        code,
        Some(0),
        "the child waited for the registry (killed after 10 s) or saw it"
    );
}

#[test]
fn only_a_compute_group_makes_a_process_the_registrys_owner() {
    let _serial = crate::cuda::fork_gate::FORK_TESTS
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    // In a child, as a process that has made no group yet: an unrelated ioctl (a terminal
    // query, as Python's start-up makes) must not claim the registry, or the workers it
    // forks later could not register their own groups.
    // SAFETY: the child only calls the interposer and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        OWNER.store(0, Ordering::SeqCst);
        let mut winsize = [0u16; 4];
        // SAFETY: TIOCGWINSZ on stdin with a buffer of its size; failure is fine.
        unsafe { ioctl(0, libc::TIOCGWINSZ, winsize.as_mut_ptr().cast()) };
        let unclaimed = OWNER.load(Ordering::SeqCst) == 0;
        claim_owner();
        let ok = unclaimed && !forked_child() && registry().is_some();
        // SAFETY: leaving the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0, "fork failed");
    assert_eq!(
        exit_code_within(pid, std::time::Duration::from_secs(10)),
        Some(0)
    );
}

fn grp(fd: c_int, client: u32, parent: u32, object: u32) -> ChannelGroup {
    ChannelGroup {
        fd,
        h_client: client,
        h_parent: parent,
        h_object: object,
    }
}

#[test]
fn closing_an_fd_forgets_its_groups() {
    let mut r = Registry::new();
    assert!(r.add(grp(5, 1, 2, 3), None));
    assert!(!r.add(grp(5, 1, 2, 3), None), "no duplicates");
    r.add(grp(6, 7, 8, 9), None);
    assert_eq!(r.forget_fd(5), 1);
    assert_eq!(r.len(), 1);
    assert_eq!(r.forget_fd(5), 0);
    assert_eq!(r.groups().next().unwrap().0.fd, 6);
}

#[test]
fn rm_free_of_the_group_its_parent_or_its_client_forgets_it() {
    let mut r = Registry::new();
    r.add(grp(5, 0xc1, 0xd0, 0x10), None);
    r.add(grp(5, 0xc1, 0xd0, 0x11), None);
    r.add(grp(5, 0xc1, 0xd1, 0x12), None);
    r.add(grp(5, 0xc2, 0xd0, 0x10), None); // same handles, another client
    assert_eq!(r.forget_freed(0xc1, 0x99), 0, "an unrelated object");
    assert_eq!(r.forget_freed(0xc1, 0x10), 1, "the group itself");
    assert_eq!(r.forget_freed(0xc1, 0xd0), 1, "its parent");
    assert_eq!(r.len(), 2);
    assert_eq!(r.forget_freed(0xc1, 0xc1), 1, "the whole client");
    assert_eq!(r.len(), 1);
    assert_eq!(r.groups().next().unwrap().0.h_client, 0xc2);
}

/// The only test besides the fork test that touches the process-wide registry.
#[test]
fn the_interposed_close_forgets_groups_even_while_the_registry_is_busy() {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let [a, b] = fds;
    {
        let mut reg = groups();
        reg.add(grp(a, 1, 2, 3), fd_identity(a));
        reg.add(grp(b, 1, 2, 4), fd_identity(b));
        GROUP_COUNT.store(reg.len(), Ordering::Release);
    }
    assert_eq!(xpreempt_shim_channel_groups(), 2);
    assert_eq!(unsafe { close(a) }, 0);
    assert_eq!(xpreempt_shim_channel_groups(), 1);
    // Closed while the registry is held elsewhere: parked, applied by the next holder.
    let held = groups();
    assert_eq!(unsafe { close(b) }, 0);
    drop(held);
    assert_eq!(xpreempt_shim_channel_groups(), 0);
}

#[test]
fn a_reused_fd_number_does_not_match() {
    let id = fd_identity(2);
    assert!(id.is_some());
    assert_eq!(fd_identity(2), id);
    assert_eq!(fd_identity(-1), None);
}
