//! One request on a client's socket (registration, hints, operator and RM-hook requests),
//! answered under the state's lock.

use crate::shared::Shared;
use crate::state::Refusal;
use xpreempt_core::sched::SchedEvent;
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg};
use xpreempt_ipc::unix::Cred;

/// The answer to `msg` from client `id`, if it has one.
pub(crate) fn handle(shared: &Shared, id: u64, cred: Cred, msg: ClientMsg) -> Option<DaemonMsg> {
    let mut st = shared.lock();
    let answer = |r: Result<u32, Refusal>| match r {
        Ok(changed) => DaemonMsg::Done { changed },
        Err(e) => DaemonMsg::Refused {
            reason: e.to_string(),
        },
    };
    let reply = match msg {
        ClientMsg::Hello { .. } => DaemonMsg::Refused {
            reason: "hello was already said".into(),
        },
        ClientMsg::Register { slot, decl } => match st.register(id, slot, decl) {
            Ok((queue, bit)) => DaemonMsg::Registered { queue, bit },
            Err(e) => DaemonMsg::Refused {
                reason: e.to_string(),
            },
        },
        ClientMsg::Unregister { queue } => answer(st.unregister(id, queue).map(|()| 1)),
        ClientMsg::Retry { queue } => {
            if let Err(e) = st.event(id, queue, SchedEvent::Admission(queue)) {
                tracing::debug!(%e, "retry");
            }
            return None;
        }
        ClientMsg::Inherit { queue, priority } => {
            if let Err(e) = st.inherit(id, queue, priority) {
                tracing::debug!(%e, "inherit");
            }
            return None;
        }
        ClientMsg::Work { queue, work } => {
            if let Err(e) = st.event(id, queue, SchedEvent::Work { queue, work }) {
                tracing::debug!(%e, "work");
            }
            st.rm_forward_work(id, queue, work);
            return None;
        }
        ClientMsg::RmTaskInit { group } => match st.rm_task_init(id, group) {
            Ok(d) => DaemonMsg::RmDecision(d),
            Err(e) => DaemonMsg::Refused {
                reason: e.to_string(),
            },
        },
        ClientMsg::RmSchedule {
            device,
            tsg,
            channels,
        } => match st.rm_schedule(id, device, tsg, channels) {
            Ok((allow, ran, note)) => DaemonMsg::RmAdmission { allow, ran, note },
            Err(e) => DaemonMsg::Refused {
                reason: e.to_string(),
            },
        },
        ClientMsg::RmEnabled { device, tsg } => {
            let _ = st.rm_enabled(id, device, tsg);
            return None;
        }
        ClientMsg::RmWork {
            device,
            tsg,
            event,
            kind,
            token,
        } => {
            let _ = st.rm_work(id, device, tsg, (event, kind, token));
            return None;
        }
        ClientMsg::RmTaskDestroy { device, tsg } => {
            let _ = st.rm_task_destroy(id, device, tsg);
            return None;
        }
        ClientMsg::SetPriority { .. } | ClientMsg::SetHints { .. }
            if !st
                .change_rate
                .take(cred.uid, shared.config.limits.changes_per_sec) =>
        {
            st.refused(crate::limits::Reason::ChangeRate);
            DaemonMsg::Refused {
                reason: format!(
                    "user {} made more than {} priority or hint changes in a second (--max-changes-per-sec)",
                    cred.uid, shared.config.limits.changes_per_sec
                ),
            }
        }
        ClientMsg::SetPriority { target, priority } => {
            answer(st.set_priority(cred, target, priority))
        }
        ClientMsg::SetHints { target, hints } => answer(st.set_hints(cred, target, hints)),
        ClientMsg::PolicyMaps => DaemonMsg::PolicyMaps(st.policy_maps()),
        ClientMsg::PolicyMapUpdate { map, key, value } => {
            answer(st.policy_map_update(cred, &map, &key, value.as_deref()))
        }
        ClientMsg::List => DaemonMsg::List(st.list()),
        ClientMsg::Stats => DaemonMsg::Stats(st.stats()),
        ClientMsg::Costs => DaemonMsg::Costs(st.mechanism_costs()),
    };
    drop(st);
    shared.ticker.notify_all();
    Some(reply)
}
