//! The tracker fed byte streams: recordings in the format `record` writes, decoded with the same
//! readers the interposer uses.

use super::*;

fn hex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

/// Replays a recording: every line through the byte readers and into the tracker, with what
/// `before_control` says for each control (on the bytes as they were after the call).
pub(super) fn replay(t: &mut Tracker, text: &str) -> Vec<(Vec<Event>, Option<Before>)> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        // As the shim logs it: `xpreempt-shim: rm-rec …`.
        let Some(rest) = line.find("rm-rec ").map(|at| &line[at + 7..]) else {
            continue;
        };
        let kind = rest.split_whitespace().next().unwrap();
        let arg = hex(field(line, "arg").unwrap());
        let params = field(line, "params").map(hex).unwrap_or_default();
        let fd = field(line, "fd").map_or(-1, |f| f.parse().unwrap());
        let (call, before) = match kind {
            "alloc" => {
                let req = if arg.len() == 48 {
                    IOCTL_RM_ALLOC_NVOS64
                } else {
                    IOCTL_RM_ALLOC_NVOS21
                };
                let a = unsafe { read_alloc(req, arg.as_ptr()) }.unwrap();
                (
                    Call::Alloc {
                        fd,
                        a,
                        params: &params,
                    },
                    None,
                )
            }
            "free" => (
                Call::Free(unsafe { read_free(IOCTL_RM_FREE, arg.as_ptr()) }.unwrap()),
                None,
            ),
            "control" => {
                let c = unsafe { read_control(IOCTL_RM_CONTROL, arg.as_ptr()) }.unwrap();
                let before = t.before_control(&c, &params);
                (
                    Call::Control {
                        fd,
                        c,
                        params: &params,
                    },
                    Some(before),
                )
            }
            other => panic!("unknown record {other}"),
        };
        out.push((t.after(call), before));
    }
    out
}

fn bytes<T: Copy>(v: &T) -> Vec<u8> {
    let p = (v as *const T).cast::<u8>();
    unsafe { std::slice::from_raw_parts(p, size_of::<T>()) }.to_vec()
}

fn line_alloc(client: u32, parent: u32, object: u32, class: u32, params: &[u8]) -> String {
    let a = Nvos64 {
        h_root: client,
        h_object_parent: parent,
        h_object_new: object,
        h_class: class,
        p_alloc_parms: 0x7f00_dead_0000,
        ..Default::default()
    };
    record(
        &Call::Alloc {
            fd: 7,
            a: unsafe { read_alloc(IOCTL_RM_ALLOC_NVOS64, bytes(&a).as_ptr()) }.unwrap(),
            params,
        },
        &bytes(&a),
    )
}

fn line_control(client: u32, object: u32, cmd: u32, params: &[u8], status: u32) -> String {
    let c = Nvos54 {
        h_client: client,
        h_object: object,
        cmd,
        params: 0x7f00_beef_0000,
        params_size: params.len() as u32,
        status,
        ..Default::default()
    };
    record(
        &Call::Control {
            fd: 7,
            c: unsafe { read_control(IOCTL_RM_CONTROL, bytes(&c).as_ptr()) }.unwrap(),
            params,
        },
        &bytes(&c),
    )
}

fn line_free(client: u32, parent: u32, object: u32) -> String {
    let f = Nvos00 {
        h_root: client,
        h_object_parent: parent,
        h_object_old: object,
        status: 0,
    };
    record(
        &Call::Free(unsafe { read_free(IOCTL_RM_FREE, bytes(&f).as_ptr()) }.unwrap()),
        &bytes(&f),
    )
}

fn group_params(engine: u32) -> Vec<u8> {
    let head = ChannelGroupAllocHead {
        engine_type: engine,
        ..Default::default()
    };
    bytes(&head)
}

const C: u32 = 0xc1d0_0001;
const DEV: u32 = 0xbeef_0001;
const TSG: u32 = 0x5c00_0042;

/// What libcuda 580 sends for one context, as the probe saw it: a device object, a copy-engine
/// group and a compute group, channels under it, SET_TIMESLICE, GPFIFO_SCHEDULE, tokens.
fn a_context() -> String {
    let mut lines = vec![
        line_alloc(C, C, DEV, CLASS_DEVICE, &3u32.to_le_bytes()),
        line_alloc(C, DEV, 0x5c00_0041, CLASS_CHANNEL_GROUP, &group_params(0xb)),
        line_alloc(C, DEV, TSG, CLASS_CHANNEL_GROUP, &group_params(1)),
    ];
    for ch in 0..8 {
        lines.push(line_alloc(C, TSG, 0x5c00_0100 + ch, 0xC86F, &[]));
    }
    lines.push(line_control(
        C,
        TSG,
        CMD_SET_TIMESLICE,
        &2048u64.to_le_bytes(),
        0,
    ));
    lines.push(line_control(C, TSG, CMD_GPFIFO_SCHEDULE, &[1, 0, 0], 0));
    lines.push(line_control(
        C,
        0x5c00_0100,
        CMD_GET_WORK_SUBMIT_TOKEN,
        &0x0001_0004u32.to_le_bytes(),
        0,
    ));
    lines.join("\n")
}

#[test]
fn a_recorded_context_builds_one_compute_group_with_its_device_and_channels() {
    let mut t = Tracker::new();
    let out = replay(&mut t, &a_context());
    let key = GroupKey {
        fd: 7,
        h_client: C,
        h_object: TSG,
    };
    let events: Vec<Event> = out.iter().flat_map(|(e, _)| e.clone()).collect();
    assert_eq!(
        events,
        vec![
            Event::GroupCreated(key),
            Event::GroupEnabled(key),
            Event::ChannelToken {
                group: key,
                token: 0x0001_0004
            }
        ],
        "the copy-engine group is not a compute group"
    );
    let g = t.group(key).unwrap();
    assert_eq!((g.device, g.channels.len(), g.h_parent), (3, 8, DEV));
    // Nothing was decided yet: libcuda's controls pass, and the first enable asks to be admitted.
    let befores: Vec<Before> = out.iter().filter_map(|(_, b)| *b).collect();
    assert_eq!(
        befores,
        vec![Before::Pass, Before::Admit(key), Before::Pass]
    );
}

#[test]
fn libcudas_set_timeslice_is_rewritten_to_the_policys_choice_and_an_enabled_group_is_not_asked_again()
 {
    let mut t = Tracker::new();
    replay(&mut t, &a_context());
    let key = GroupKey {
        fd: 7,
        h_client: C,
        h_object: TSG,
    };
    t.group_mut(key).unwrap().timeslice_us = Some(10_000);
    let again = [
        line_control(C, TSG, CMD_SET_TIMESLICE, &2048u64.to_le_bytes(), 0),
        line_control(C, TSG, CMD_SET_TIMESLICE, &10_000u64.to_le_bytes(), 0),
        line_control(C, TSG, CMD_GPFIFO_SCHEDULE, &[1, 0, 0], 0),
        line_control(C, TSG, CMD_GPFIFO_SCHEDULE, &[0, 0, 0], 0),
        // Another client's object with the same handle is not ours.
        line_control(C + 1, TSG, CMD_SET_TIMESLICE, &2048u64.to_le_bytes(), 0),
    ]
    .join("\n");
    let befores: Vec<Before> = replay(&mut t, &again)
        .into_iter()
        .filter_map(|(_, b)| b)
        .collect();
    assert_eq!(
        befores,
        vec![
            Before::RewriteTimeslice {
                group: key,
                from: 2048,
                to: 10_000
            },
            Before::Pass,
            Before::Pass,
            Before::Pass,
            Before::Pass
        ]
    );
}

#[test]
fn freeing_the_group_its_device_or_its_client_destroys_it_once() {
    let key = GroupKey {
        fd: 7,
        h_client: C,
        h_object: TSG,
    };
    for freed in [TSG, DEV, C] {
        let mut t = Tracker::new();
        replay(&mut t, &a_context());
        let out = replay(&mut t, &line_free(C, DEV, freed));
        match &out[0].0[..] {
            [Event::GroupsFreed(gs)] => assert_eq!(gs[0].key, key),
            other => panic!("free of {freed:#x}: {other:?}"),
        }
        assert!(t.groups().is_empty());
        assert!(replay(&mut t, &line_free(C, DEV, freed))[0].0.is_empty());
    }
    // A channel's free keeps the group; a failed call changes nothing.
    let mut t = Tracker::new();
    replay(&mut t, &a_context());
    replay(&mut t, &line_free(C, TSG, 0x5c00_0100));
    assert_eq!(t.group(key).unwrap().channels.len(), 7);
    let failed = line_control(C, 0x5c00_0101, CMD_GET_WORK_SUBMIT_TOKEN, &[0; 4], 0x1f);
    assert!(replay(&mut t, &failed)[0].0.is_empty());
    assert_eq!(t.forget_fd(7).len(), 1);
}

/// A real recording: one context created by libcuda 580.159.04 on an H100 (`spin.cu` under
/// `XPREEMPT_SHIM_LOG=3`, bench/rm-hooks/run.sh), every RM call the hooks saw, in order.
const H100_CONTEXT: &str = include_str!("fixtures/h100-580.159.04-context.rec");

#[test]
fn a_real_libcuda_context_yields_one_compute_group_its_eight_channels_and_their_tokens() {
    let mut t = Tracker::new();
    let out = replay(&mut t, H100_CONTEXT);
    let events: Vec<Event> = out.iter().flat_map(|(e, _)| e.clone()).collect();
    let created: Vec<GroupKey> = events
        .iter()
        .filter_map(|e| match e {
            Event::GroupCreated(k) => Some(*k),
            _ => None,
        })
        .collect();
    assert_eq!(
        created.len(),
        1,
        "three copy-engine groups are not compute groups"
    );
    let key = created[0];
    assert_eq!(key.h_object, 0x5c00_0015);
    let tokens: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::ChannelToken { group, token } if *group == key => Some(*token),
            _ => None,
        })
        .collect();
    // Runlist 0, channels 10..=17: one token per channel, asked once, at creation.
    assert_eq!(tokens, (0x0a..=0x11).collect::<Vec<u32>>());
    assert!(events.contains(&Event::GroupEnabled(key)));
    let g = t.group(key).unwrap();
    assert_eq!(
        g.channels.len(),
        8,
        "the context-share object is not a channel"
    );
    assert_eq!(g.device, 0);
    // libcuda enabled the group after its channels, and set its timeslice (2048 us) last.
    let befores: Vec<Before> = out
        .iter()
        .filter_map(|(_, b)| *b)
        .filter(|b| *b != Before::Pass)
        .collect();
    assert_eq!(befores, vec![Before::Admit(key)]);
    let mut decided = Tracker::new();
    let mut first = true;
    for line in H100_CONTEXT.lines() {
        let r = replay(&mut decided, line);
        if first && decided.group(key).is_some() {
            decided.group_mut(key).unwrap().timeslice_us = Some(10_000);
            first = false;
        }
        if let Some((_, Some(Before::RewriteTimeslice { from, to, .. }))) = r.first() {
            assert_eq!((*from, *to), (2048, 10_000));
            return;
        }
    }
    panic!("libcuda's SET_TIMESLICE was not seen");
}
