//! The driver's own controls on a channel group, sent on libcuda's fd and RM client with the
//! real `ioctl` (never through the interposer). Every call's outcome is checked: the ioctl's
//! errno, then RM's status.

use super::abi::*;
use super::real_ioctl;
use std::ffi::{c_int, c_ulong};

/// Why a control did not take effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// The ioctl itself failed with this errno.
    Errno(i32),
    /// RM refused with this status (0x56 NOT_SUPPORTED, 0x1f INVALID_ARGUMENT, …).
    Status(u32),
}

impl ControlError {
    /// The shim's C convention: `-errno`, or the RM status.
    pub fn code(self) -> i64 {
        match self {
            ControlError::Errno(e) => -i64::from(e),
            ControlError::Status(s) => i64::from(s),
        }
    }
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::Errno(e) => write!(f, "ioctl failed, errno {e}"),
            ControlError::Status(NV_ERR_NOT_SUPPORTED) => {
                f.write_str("RM status 0x56 NOT_SUPPORTED")
            }
            ControlError::Status(s) => write!(f, "RM status {s:#x}"),
        }
    }
}

/// Sends `cmd` with `params` to object `h_object` of client `h_client` on `fd`.
pub fn control(
    fd: c_int,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: &mut [u8],
) -> Result<(), ControlError> {
    let Some(real) = real_ioctl() else {
        return Err(ControlError::Errno(libc::ENOSYS));
    };
    let mut ctl = Nvos54 {
        h_client,
        h_object,
        cmd,
        flags: 0,
        params: params.as_mut_ptr() as u64,
        params_size: params.len() as u32,
        status: 0,
    };
    // SAFETY: a well-formed NVOS54 whose params point to `params`, alive for the call.
    let r = unsafe {
        real(
            fd,
            IOCTL_RM_CONTROL as c_ulong,
            (&mut ctl as *mut Nvos54).cast(),
        )
    };
    if r != 0 {
        // SAFETY: reading errno.
        return Err(ControlError::Errno(unsafe { *libc::__errno_location() }));
    }
    match ctl.status {
        NV_OK => Ok(()),
        s => Err(ControlError::Status(s)),
    }
}

pub fn set_timeslice(fd: c_int, h_client: u32, h_object: u32, us: u64) -> Result<(), ControlError> {
    control(
        fd,
        h_client,
        h_object,
        CMD_SET_TIMESLICE,
        &mut us.to_le_bytes(),
    )
}

pub fn get_timeslice(fd: c_int, h_client: u32, h_object: u32) -> Result<u64, ControlError> {
    let mut p = [0u8; 8];
    control(fd, h_client, h_object, CMD_GET_TIMESLICE, &mut p)?;
    Ok(u64::from_le_bytes(p))
}

/// The hardware TSG id.
pub fn get_tsg_id(fd: c_int, h_client: u32, h_object: u32) -> Result<u32, ControlError> {
    let mut p = [0u8; 4];
    control(fd, h_client, h_object, CMD_GET_INFO, &mut p)?;
    Ok(u32::from_le_bytes(p))
}

/// `level`: 0 LOW, 1 MEDIUM, 2 HIGH.
pub fn set_interleave_level(
    fd: c_int,
    h_client: u32,
    h_object: u32,
    level: u32,
) -> Result<(), ControlError> {
    control(
        fd,
        h_client,
        h_object,
        CMD_SET_INTERLEAVE_LEVEL,
        &mut level.to_le_bytes(),
    )
}
