//! The process's RM objects as libcuda creates them, read from its ioctls: device objects (for
//! the device instance), compute channel groups and their channels, and what the RM hooks decided
//! for each group. Plain bookkeeping over decoded calls and their params bytes, so that tests
//! feed it recorded byte streams (the format [`record`] writes at `XPREEMPT_SHIM_LOG=3`).

use super::abi::*;
use std::ffi::c_int;

/// A channel group, as RM names it: a handle of a client (on the fd it was created on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupKey {
    pub fd: c_int,
    pub h_client: u32,
    pub h_object: u32,
}

/// A compute channel group and what the hooks made of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub key: GroupKey,
    pub h_parent: u32,
    /// The RM device instance (NV0080's deviceId) of its parent; 0 when the parent was not seen.
    pub device: u32,
    /// Handles of its channels (the objects allocated under it).
    pub channels: Vec<u32>,
    /// The hardware TSG id, or the stand-in the hooks used (see `hooks.rs`).
    pub tsg: u32,
    /// The timeslice the policy chose (µs): libcuda's own SET_TIMESLICE is rewritten to it.
    pub timeslice_us: Option<u64>,
    /// task_init ran for it (the hooks know it).
    pub announced: bool,
    /// libcuda's GPFIFO_SCHEDULE(1) went through.
    pub enabled: bool,
}

/// One RM call, decoded; `params` are the bytes its params pointer points to.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    Alloc {
        fd: c_int,
        a: AllocSeen,
        params: &'a [u8],
    },
    Free(FreeSeen),
    Control {
        fd: c_int,
        c: ControlSeen,
        params: &'a [u8],
    },
}

/// What a successful call means for the hooks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A compute channel group was created: task_init.
    GroupCreated(GroupKey),
    /// One of its channels got its work-submit token: work_submit (XP_WORK_CHANNEL).
    ChannelToken { group: GroupKey, token: u32 },
    /// libcuda's GPFIFO_SCHEDULE(1) went through.
    GroupEnabled(GroupKey),
    /// Groups gone with an RM_FREE (the group, its parent or its client): task_destroy each.
    GroupsFreed(Vec<Group>),
}

/// What to do before libcuda's control reaches the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Before {
    Pass,
    /// libcuda's SET_TIMESLICE of a group whose timeslice the policy chose: send `to` instead.
    RewriteTimeslice {
        group: GroupKey,
        from: u64,
        to: u64,
    },
    /// libcuda enables a group not yet admitted: ask `schedule` first.
    Admit(GroupKey),
}

#[derive(Debug, Default)]
pub struct Tracker {
    /// (client, handle, device instance) of NV01_DEVICE_0 objects.
    devices: Vec<(u32, u32, u32)>,
    groups: Vec<Group>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// How many params bytes of a control the tracker reads (the largest it understands).
pub const CONTROL_PARAMS_READ: usize = 8;
/// How many params bytes of an alloc the tracker reads (engineType ends at 16).
pub const ALLOC_PARAMS_READ: usize = 16;

impl Tracker {
    pub const fn new() -> Self {
        Self {
            devices: Vec::new(),
            groups: Vec::new(),
        }
    }

    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    pub fn group(&self, key: GroupKey) -> Option<&Group> {
        self.groups.iter().find(|g| g.key == key)
    }

    pub fn group_mut(&mut self, key: GroupKey) -> Option<&mut Group> {
        self.groups.iter_mut().find(|g| g.key == key)
    }

    fn by_handle(&self, h_client: u32, h_object: u32) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.key.h_client == h_client && g.key.h_object == h_object)
    }

    /// The group whose channel `h_object` is.
    fn by_channel(&self, h_client: u32, h_object: u32) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.key.h_client == h_client && g.channels.contains(&h_object))
    }

    /// Whether a control is one the hooks act on before it runs (cheap: the command only).
    pub fn acts_before(cmd: u32) -> bool {
        cmd == CMD_SET_TIMESLICE || cmd == CMD_GPFIFO_SCHEDULE
    }

    /// Whether a call's outcome matters to the tracker (cheap: request and command only).
    pub fn watches_control(cmd: u32) -> bool {
        cmd == CMD_GET_WORK_SUBMIT_TOKEN || cmd == CMD_GPFIFO_SCHEDULE
    }

    /// What to do with libcuda's control before the driver sees it.
    pub fn before_control(&self, c: &ControlSeen, params: &[u8]) -> Before {
        let Some(g) = self.by_handle(c.h_client, c.h_object) else {
            return Before::Pass;
        };
        match c.cmd {
            CMD_SET_TIMESLICE if c.params_size as usize == size_of::<SetTimeslice>() => {
                match (g.timeslice_us, u64_at(params, 0)) {
                    (Some(to), Some(from)) if to != from => Before::RewriteTimeslice {
                        group: g.key,
                        from,
                        to,
                    },
                    _ => Before::Pass,
                }
            }
            // bEnable is the first byte; GPFIFO_SCHEDULE(0) disables and is left alone.
            CMD_GPFIFO_SCHEDULE
                if c.params_size >= 1 && params.first() == Some(&1) && !g.enabled =>
            {
                Before::Admit(g.key)
            }
            _ => Before::Pass,
        }
    }

    /// Takes in a call that returned; failed calls change nothing.
    pub fn after(&mut self, call: Call<'_>) -> Vec<Event> {
        match call {
            Call::Alloc { fd, a, params } if a.status == NV_OK => self.allocated(fd, a, params),
            Call::Free(f) if f.status == NV_OK => self.freed(f),
            Call::Control { c, params, .. } if c.status == NV_OK => match c.cmd {
                CMD_GET_WORK_SUBMIT_TOKEN => self
                    .by_channel(c.h_client, c.h_object)
                    .zip(u32_at(params, 0))
                    .map(|(g, token)| Event::ChannelToken {
                        group: g.key,
                        token,
                    })
                    .into_iter()
                    .collect(),
                CMD_GPFIFO_SCHEDULE if params.first() == Some(&1) => {
                    let Some(g) = self
                        .groups
                        .iter_mut()
                        .find(|g| g.key.h_client == c.h_client && g.key.h_object == c.h_object)
                    else {
                        return Vec::new();
                    };
                    if std::mem::replace(&mut g.enabled, true) {
                        return Vec::new();
                    }
                    vec![Event::GroupEnabled(g.key)]
                }
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    fn allocated(&mut self, fd: c_int, a: AllocSeen, params: &[u8]) -> Vec<Event> {
        if a.h_class == CLASS_DEVICE {
            let instance = u32_at(params, 0).unwrap_or(0);
            self.devices
                .retain(|d| (d.0, d.1) != (a.h_client, a.h_object));
            self.devices.push((a.h_client, a.h_object, instance));
            return Vec::new();
        }
        if a.h_class == CLASS_CHANNEL_GROUP {
            if u32_at(params, 12) != Some(ENGINE_TYPE_GRAPHICS_COMPUTE) {
                return Vec::new();
            }
            let key = GroupKey {
                fd,
                h_client: a.h_client,
                h_object: a.h_object,
            };
            let device = self
                .devices
                .iter()
                .find(|d| d.0 == a.h_client && d.1 == a.h_parent)
                .map_or(0, |d| d.2);
            self.groups.retain(|g| g.key != key);
            self.groups.push(Group {
                key,
                h_parent: a.h_parent,
                device,
                channels: Vec::new(),
                tsg: a.h_object,
                timeslice_us: None,
                announced: false,
                enabled: false,
            });
            return vec![Event::GroupCreated(key)];
        }
        // A GPFIFO channel (class 0x..6F: 0xC86F on Hopper) allocated under a channel group is
        // one of its channels (libcuda also puts a context-share object, 0x9067, there).
        if a.h_class & 0xff != 0x6f {
            return Vec::new();
        }
        if let Some(g) = self
            .groups
            .iter_mut()
            .find(|g| g.key.h_client == a.h_client && g.key.h_object == a.h_parent)
        {
            g.channels.push(a.h_object);
        }
        Vec::new()
    }

    fn freed(&mut self, f: FreeSeen) -> Vec<Event> {
        let gone = |g: &Group| {
            g.key.h_client == f.h_client
                && (f.h_object == g.key.h_object
                    || f.h_object == g.h_parent
                    || f.h_object == g.key.h_client)
        };
        let (freed, kept): (Vec<Group>, Vec<Group>) =
            std::mem::take(&mut self.groups).into_iter().partition(gone);
        self.groups = kept;
        for g in &mut self.groups {
            if g.key.h_client == f.h_client {
                g.channels.retain(|&c| c != f.h_object);
            }
        }
        self.devices
            .retain(|d| d.0 != f.h_client || (f.h_object != d.1 && f.h_object != d.0));
        if freed.is_empty() {
            Vec::new()
        } else {
            vec![Event::GroupsFreed(freed)]
        }
    }

    /// The fd was closed: its groups are gone without an RM_FREE.
    pub fn forget_fd(&mut self, fd: c_int) -> Vec<Group> {
        let (gone, kept) = std::mem::take(&mut self.groups)
            .into_iter()
            .partition(|g| g.key.fd == fd);
        self.groups = kept;
        gone
    }

    /// Every group (the process is exiting).
    pub fn take_all(&mut self) -> Vec<Group> {
        std::mem::take(&mut self.groups)
    }
}

/// One line of a recording: what the tracker was fed, as hex, so that a run on the GPU machine
/// becomes a test fixture.
pub fn record(call: &Call<'_>, arg: &[u8]) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    match call {
        Call::Alloc { fd, params, .. } => {
            format!(
                "rm-rec alloc fd={fd} arg={} params={}",
                hex(arg),
                hex(params)
            )
        }
        Call::Free(_) => format!("rm-rec free arg={}", hex(arg)),
        Call::Control { fd, params, .. } => {
            format!(
                "rm-rec control fd={fd} arg={} params={}",
                hex(arg),
                hex(params)
            )
        }
    }
}

#[cfg(test)]
#[path = "context_tests.rs"]
mod tests;
