//! NVIDIA resource-manager (RM) ioctl structures, written from the published ABI facts of the
//! channel-group controls, as measured on an H100 with driver 580.159.04 (no driver code copied).

/// ioctl "type" of the nvidia control device.
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;
/// NV_ESC_RM_ALLOC number.
pub const NV_ESC_RM_ALLOC: u32 = 0x2B;
/// NV_ESC_RM_FREE number.
pub const NV_ESC_RM_FREE: u32 = 0x29;
/// NV_ESC_RM_CONTROL number.
pub const NV_ESC_RM_CONTROL: u32 = 0x2A;
/// RM_CONTROL with NVOS54 (32 bytes).
pub const IOCTL_RM_CONTROL: u64 = 0xC020_462A;
/// RM_FREE with NVOS00 (16 bytes).
pub const IOCTL_RM_FREE: u64 = 0xC010_4629;
/// RM_ALLOC with NVOS64 (48 bytes), what libcuda 580 sends.
pub const IOCTL_RM_ALLOC_NVOS64: u64 = 0xC030_462B;
/// RM_ALLOC with NVOS21 (32 bytes).
pub const IOCTL_RM_ALLOC_NVOS21: u64 = 0xC020_462B;

/// Channel group (TSG) class.
pub const CLASS_CHANNEL_GROUP: u32 = 0xA06C;
/// Compute engine type in the channel-group alloc params.
pub const ENGINE_TYPE_GRAPHICS_COMPUTE: u32 = 1;
/// NVA06C_CTRL_CMD_SET_TIMESLICE.
pub const CMD_SET_TIMESLICE: u32 = 0xa06c_0103;
/// NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: params {bEnable, bSkipSubmit, bSkipEnable}, 3 bytes on 580.
pub const CMD_GPFIFO_SCHEDULE: u32 = 0xa06c_0101;
/// NVA06C_CTRL_CMD_GET_TIMESLICE: params {u64 timesliceUs}.
pub const CMD_GET_TIMESLICE: u32 = 0xa06c_0104;
/// NVA06C_CTRL_CMD_GET_INFO: params {u32 tsgID}, the hardware TSG id.
pub const CMD_GET_INFO: u32 = 0xa06c_0106;
/// NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL: params {u32 tsgInterleaveLevel} (0 LOW, 1 MEDIUM,
/// 2 HIGH); the header says it needs a privileged client.
pub const CMD_SET_INTERLEAVE_LEVEL: u32 = 0xa06c_0107;
/// NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN on a channel: params {u32 workSubmitToken}
/// (runlist << 16 | channel id on Ampere and Hopper).
pub const CMD_GET_WORK_SUBMIT_TOKEN: u32 = 0xc36f_0108;
/// NV01_DEVICE_0: its alloc params start with the device instance (u32 deviceId).
pub const CLASS_DEVICE: u32 = 0x80;
/// RM status codes seen on this driver.
pub const NV_OK: u32 = 0;
pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;

/// RM_ALLOC parameters, short form (NVOS21, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos21 {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_new: u32,
    pub h_class: u32,
    pub p_alloc_parms: u64,
    pub params_size: u32,
    pub status: u32,
}

/// RM_ALLOC parameters, long form (NVOS64, 48 bytes): NVOS21's fields first, then more.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos64 {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_new: u32,
    pub h_class: u32,
    pub p_alloc_parms: u64,
    pub p_right_requested: u64,
    pub params_size: u32,
    pub flags: u32,
    pub status: u32,
    pub _pad: u32,
}

/// RM_FREE parameters (NVOS00, 16 bytes). Freeing an object frees its children; freeing the
/// client (`h_object_old == h_root`) frees everything it holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos00 {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_old: u32,
    pub status: u32,
}

/// RM_CONTROL parameters (NVOS54, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos54 {
    pub h_client: u32,
    pub h_object: u32,
    pub cmd: u32,
    pub flags: u32,
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// The head of the channel-group alloc params: engineType at byte 12.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ChannelGroupAllocHead {
    pub h_object_error: u32,
    pub h_object_ecc_error: u32,
    pub h_va_space: u32,
    pub engine_type: u32,
}

/// SET_TIMESLICE params.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SetTimeslice {
    pub timeslice_us: u64,
}

/// An ioctl request split into its fields (Linux _IOC encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IocRequest {
    pub dir: u32,
    pub size: u32,
    pub kind: u32,
    pub nr: u32,
}

pub fn decode(request: u64) -> IocRequest {
    let r = request as u32;
    IocRequest {
        nr: r & 0xff,
        kind: (r >> 8) & 0xff,
        size: (r >> 16) & 0x3fff,
        dir: r >> 30,
    }
}

/// What an RM_ALLOC carried, whichever form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocSeen {
    pub h_client: u32,
    pub h_parent: u32,
    pub h_object: u32,
    pub h_class: u32,
    pub p_params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// Reads an RM_ALLOC argument, after the call returned. `None` for other ioctls.
///
/// # Safety
/// `arg` must point to the request's argument of `decode(request).size` bytes.
pub unsafe fn read_alloc(request: u64, arg: *const u8) -> Option<AllocSeen> {
    let d = decode(request);
    if d.kind != NV_IOCTL_MAGIC || d.nr != NV_ESC_RM_ALLOC || arg.is_null() {
        return None;
    }
    match d.size as usize {
        s if s == size_of::<Nvos64>() => {
            // SAFETY: caller guarantees 48 readable bytes.
            let a = unsafe { std::ptr::read_unaligned(arg.cast::<Nvos64>()) };
            Some(AllocSeen {
                h_client: a.h_root,
                h_parent: a.h_object_parent,
                h_object: a.h_object_new,
                h_class: a.h_class,
                p_params: a.p_alloc_parms,
                params_size: a.params_size,
                status: a.status,
            })
        }
        s if s == size_of::<Nvos21>() => {
            // SAFETY: caller guarantees 32 readable bytes.
            let a = unsafe { std::ptr::read_unaligned(arg.cast::<Nvos21>()) };
            Some(AllocSeen {
                h_client: a.h_root,
                h_parent: a.h_object_parent,
                h_object: a.h_object_new,
                h_class: a.h_class,
                p_params: a.p_alloc_parms,
                params_size: a.params_size,
                status: a.status,
            })
        }
        _ => None,
    }
}

/// What an RM_CONTROL carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlSeen {
    pub h_client: u32,
    pub h_object: u32,
    pub cmd: u32,
    pub p_params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// Reads an RM_CONTROL argument (before or after the call). `None` for other ioctls.
///
/// # Safety
/// `arg` must point to the request's argument of `decode(request).size` bytes.
pub unsafe fn read_control(request: u64, arg: *const u8) -> Option<ControlSeen> {
    if request != IOCTL_RM_CONTROL || arg.is_null() {
        return None;
    }
    // SAFETY: caller guarantees 32 readable bytes.
    let c = unsafe { std::ptr::read_unaligned(arg.cast::<Nvos54>()) };
    Some(ControlSeen {
        h_client: c.h_client,
        h_object: c.h_object,
        cmd: c.cmd,
        p_params: c.params,
        params_size: c.params_size,
        status: c.status,
    })
}

/// What an RM_FREE carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeSeen {
    pub h_client: u32,
    pub h_parent: u32,
    pub h_object: u32,
    pub status: u32,
}

/// Reads an RM_FREE argument, after the call returned. `None` for other ioctls.
///
/// # Safety
/// `arg` must point to the request's argument of `decode(request).size` bytes.
pub unsafe fn read_free(request: u64, arg: *const u8) -> Option<FreeSeen> {
    let d = decode(request);
    if d.kind != NV_IOCTL_MAGIC
        || d.nr != NV_ESC_RM_FREE
        || d.size as usize != size_of::<Nvos00>()
        || arg.is_null()
    {
        return None;
    }
    // SAFETY: caller guarantees 16 readable bytes.
    let a = unsafe { std::ptr::read_unaligned(arg.cast::<Nvos00>()) };
    Some(FreeSeen {
        h_client: a.h_root,
        h_parent: a.h_object_parent,
        h_object: a.h_object_old,
        status: a.status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layouts_match_the_published_facts() {
        assert_eq!(size_of::<Nvos21>(), 32);
        assert_eq!(offset_of!(Nvos21, p_alloc_parms), 16);
        assert_eq!(offset_of!(Nvos21, params_size), 24);
        assert_eq!(offset_of!(Nvos21, status), 28);
        assert_eq!(size_of::<Nvos64>(), 48);
        assert_eq!(size_of::<Nvos54>(), 32);
        assert_eq!(offset_of!(Nvos54, params), 16);
        assert_eq!(offset_of!(Nvos54, params_size), 24);
        assert_eq!(offset_of!(Nvos54, status), 28);
        assert_eq!(offset_of!(ChannelGroupAllocHead, engine_type), 12);
        assert_eq!(size_of::<SetTimeslice>(), 8);
        assert_eq!(size_of::<Nvos00>(), 16);
        assert_eq!(offset_of!(Nvos00, h_object_old), 8);
        assert_eq!(offset_of!(Nvos00, status), 12);
    }

    #[test]
    fn frees_are_read() {
        let d = decode(IOCTL_RM_FREE);
        assert_eq!(
            (d.dir, d.size, d.kind, d.nr),
            (3, 16, NV_IOCTL_MAGIC, NV_ESC_RM_FREE)
        );
        let f = Nvos00 {
            h_root: 0xc1d0_0001,
            h_object_parent: 0xbeef_0001,
            h_object_old: 0x5c00_0042,
            status: 0,
        };
        let seen = unsafe { read_free(IOCTL_RM_FREE, (&f as *const Nvos00).cast()) }.unwrap();
        assert_eq!(
            (seen.h_client, seen.h_parent, seen.h_object),
            (0xc1d0_0001, 0xbeef_0001, 0x5c00_0042)
        );
        assert!(unsafe { read_free(IOCTL_RM_CONTROL, (&f as *const Nvos00).cast()) }.is_none());
    }

    #[test]
    fn ioctl_numbers_decode() {
        let d = decode(IOCTL_RM_ALLOC_NVOS64);
        assert_eq!(
            (d.dir, d.size, d.kind, d.nr),
            (3, 48, NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC)
        );
        assert_eq!(decode(IOCTL_RM_CONTROL).size, 32);
        assert_eq!(decode(IOCTL_RM_CONTROL).nr, NV_ESC_RM_CONTROL);
        assert_eq!(decode(IOCTL_RM_ALLOC_NVOS21).size, 32);
    }

    #[test]
    fn allocs_are_read_in_both_forms() {
        let a = Nvos64 {
            h_root: 0xc1d0_0001,
            h_object_new: 0x5c00_0042,
            h_class: CLASS_CHANNEL_GROUP,
            p_alloc_parms: 0x1000,
            params_size: 20,
            ..Default::default()
        };
        let seen =
            unsafe { read_alloc(IOCTL_RM_ALLOC_NVOS64, (&a as *const Nvos64).cast()) }.unwrap();
        assert_eq!(
            (seen.h_client, seen.h_object, seen.h_class),
            (0xc1d0_0001, 0x5c00_0042, 0xA06C)
        );
        let b = Nvos21 {
            h_root: 7,
            h_object_new: 9,
            h_class: 0xC86F,
            ..Default::default()
        };
        let seen =
            unsafe { read_alloc(IOCTL_RM_ALLOC_NVOS21, (&b as *const Nvos21).cast()) }.unwrap();
        assert_eq!((seen.h_client, seen.h_object, seen.h_class), (7, 9, 0xC86F));
        assert!(unsafe { read_alloc(IOCTL_RM_CONTROL, (&b as *const Nvos21).cast()) }.is_none());
    }
}
