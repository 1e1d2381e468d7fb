//! The state directory: concurrent writers lose nothing; a directory others control is refused;
//! a map's file name and its name inside agree.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use xpreempt_bpf::maps::UPDATE_ANY;
use xpreempt_bpf::pin::{PinError, StateDir, UnsafeDir};

struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xpreempt-pin-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn installed(dir: &Path) -> StateDir {
    let state = StateDir::new(dir);
    state
        .install(
            "fixed_priority",
            "fixed_priority.o",
            &common::object("fixed_priority"),
        )
        .expect("installs");
    state
}

fn chmod(dir: &Path, mode: u32) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
}

const COUNTER: u64 = 1 << 40;

#[test]
fn concurrent_writers_lose_no_update() {
    const N: u64 = 150;
    let tmp = TempDir::new("concurrent");
    let state = installed(&tmp.0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let state = state.clone();
            s.spawn(move || {
                for i in 0..N {
                    state
                        .update_map("priorities", |m| {
                            // One key per update, and one counter both threads increment: a
                            // lost update shows as a missing key or a short count.
                            m.update(&(t * N + i).to_le_bytes(), &1i32.to_le_bytes(), UPDATE_ANY)?;
                            let n = m
                                .get(&COUNTER.to_le_bytes())
                                .map_or(0, |v| i32::from_le_bytes(v.try_into().unwrap()));
                            m.update(&COUNTER.to_le_bytes(), &(n + 1).to_le_bytes(), UPDATE_ANY)
                        })
                        .expect("update");
                }
            });
        }
    });
    let m = state.map("priorities").unwrap();
    let counted = i32::from_le_bytes(m.get(&COUNTER.to_le_bytes()).unwrap().try_into().unwrap());
    assert_eq!(m.len() as u64, 2 * N + 1, "every key landed");
    assert_eq!(counted as u64, 2 * N, "every increment landed");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.0.join("maps"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn a_new_state_directory_is_private() {
    let tmp = TempDir::new("private");
    installed(&tmp.0);
    let mode = std::fs::metadata(&tmp.0).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn reading_a_missing_state_directory_does_not_create_it() {
    let tmp = TempDir::new("missing");
    let state = StateDir::new(&tmp.0);
    assert!(matches!(state.installed(), Err(PinError::NotInstalled(_))));
    assert!(state.snapshots().unwrap().is_empty());
    assert!(!tmp.0.exists());
}

#[test]
fn a_group_or_world_writable_state_directory_is_refused() {
    let tmp = TempDir::new("writable");
    let state = installed(&tmp.0);
    for mode in [0o770, 0o702, 0o777] {
        chmod(&tmp.0, mode);
        for e in [
            state.installed().unwrap_err(),
            state.snapshots().unwrap_err(),
            state.map("priorities").unwrap_err(),
            state
                .update_map("priorities", |m| m.delete(&1u64.to_le_bytes()))
                .unwrap_err(),
        ] {
            assert!(
                matches!(&e, PinError::Unsafe { why: UnsafeDir::Writable { mode: m }, .. } if *m == mode),
                "{mode:o}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("refusing the state directory") && text.contains("others may write"),
                "{text}"
            );
        }
    }
    chmod(&tmp.0, 0o750);
    state.installed().expect("readable by the group is fine");
}

#[test]
fn a_symlinked_state_directory_is_refused() {
    let tmp = TempDir::new("symlink");
    std::fs::create_dir(&tmp.0).unwrap();
    let real = tmp.0.join("real");
    installed(&real);
    let link = tmp.0.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = StateDir::new(&link).installed().unwrap_err();
    assert!(
        matches!(
            e,
            PinError::Unsafe {
                why: UnsafeDir::Symlink,
                ..
            }
        ),
        "{e}"
    );
}

/// Only root can give a directory to another user, so this runs only as root (elsewhere it
/// passes without checking anything); the permission tests above always run.
#[test]
fn a_state_directory_owned_by_another_user_is_refused_when_run_as_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to chown the directory to another user");
        return;
    }
    let tmp = TempDir::new("foreign");
    let state = installed(&tmp.0);
    std::os::unix::fs::chown(&tmp.0, Some(65534), None).unwrap();
    let e = state.map("priorities").unwrap_err();
    assert!(
        matches!(
            e,
            PinError::Unsafe {
                why: UnsafeDir::Owner { owner: 65534, .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
}

#[test]
fn a_map_file_whose_name_disagrees_with_its_map_is_refused() {
    let tmp = TempDir::new("names");
    let state = installed(&tmp.0);
    let maps = tmp.0.join("maps");
    std::fs::copy(maps.join("priorities.json"), maps.join("renamed.json")).unwrap();
    let e = state.map("renamed").unwrap_err();
    assert!(
        matches!(&e, PinError::NameMismatch { file, inside, .. } if file == "renamed" && inside == "priorities"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("holds map `priorities`, not `renamed`")
    );
    assert!(matches!(
        state.snapshots(),
        Err(PinError::NameMismatch { .. })
    ));
    std::fs::remove_file(maps.join("renamed.json")).unwrap();
    assert_eq!(state.snapshots().unwrap().len(), 2);
}

/// Hooks run against the installed program by several processes (the shim's RM hooks without a
/// daemon) share its maps through the directory: what one run leaves, the next one sees.
#[test]
fn runs_against_the_installed_program_share_its_maps() {
    use xpreempt_bpf::ctx::ScheduleCtx;
    use xpreempt_bpf::rm::rm_queue_id;
    let dir = TempDir::new("with-installed");
    let state = StateDir::new(&dir.0);
    state
        .install(
            "rm_admission",
            "rm_admission.o",
            &common::object("rm_admission"),
        )
        .unwrap();
    let ask = |pid: u32| {
        state
            .with_installed(Default::default(), |h| {
                let mut c = ScheduleCtx {
                    queue_id: rm_queue_id(pid, 0, pid),
                    allow_schedule: 1,
                    ..Default::default()
                };
                h.run_ctx(&mut c, 0);
                c.allow_schedule
            })
            .unwrap()
    };
    assert_eq!(ask(10), 1, "the first group takes the slot");
    assert_eq!(ask(20), 0, "another process's run sees it taken");
    assert_eq!(ask(10), 1, "the holder still holds it");
    let held = state.map("held").unwrap();
    assert_eq!(held.get(&0u32.to_le_bytes()).unwrap(), 1u64.to_le_bytes());
    assert!(matches!(
        StateDir::new(dir.0.join("none")).with_installed(Default::default(), |_| ()),
        Err(PinError::NotInstalled(_))
    ));
}
