use super::*;

/// The only test that touches the hooks' process-wide state: libcuda's SET_TIMESLICE, as the
/// interposer hands it over, carries the policy's value to the driver and libcuda's own back.
#[test]
fn the_interposer_rewrites_libcudas_set_timeslice_and_restores_it() {
    let key = GroupKey {
        fd: 9,
        h_client: 0xc1,
        h_object: 0x42,
    };
    let alloc = AllocSeen {
        h_client: key.h_client,
        h_parent: 0xd0,
        h_object: key.h_object,
        h_class: CLASS_CHANNEL_GROUP,
        p_params: 1,
        params_size: 0,
        status: 0,
    };
    let mut head = [0u8; 16];
    head[12] = 1;
    tracker().after(Call::Alloc {
        fd: key.fd,
        a: alloc,
        params: &head,
    });
    tracker().group_mut(key).unwrap().timeslice_us = Some(10_000);
    STATE.store(ACTIVE, Ordering::Release);
    let mut value = 2048u64;
    let mut ctl = Nvos54 {
        h_client: key.h_client,
        h_object: key.h_object,
        cmd: CMD_SET_TIMESLICE,
        params: (&mut value as *mut u64) as u64,
        params_size: 8,
        ..Default::default()
    };
    let arg = (&mut ctl as *mut Nvos54).cast::<u8>();
    let pre = unsafe { before(arg) };
    assert_eq!(value, 10_000, "the driver gets the policy's value");
    unsafe { after(key.fd, IOCTL_RM_CONTROL, arg, pre) };
    assert_eq!(value, 2048, "libcuda gets its own back");
    // Another command on the group, or a group the policy left alone, is untouched.
    let set_cmd = |cmd| unsafe { (*arg.cast::<Nvos54>()).cmd = cmd };
    set_cmd(CMD_GET_TIMESLICE);
    assert!(matches!(unsafe { before(arg) }, Pre::Nothing));
    set_cmd(CMD_SET_TIMESLICE);
    tracker().group_mut(key).unwrap().timeslice_us = None;
    assert!(matches!(unsafe { before(arg) }, Pre::Nothing));
    assert_eq!(value, 2048);
    STATE.store(UNREAD, Ordering::Release);
    tracker().forget_fd(key.fd);
}
