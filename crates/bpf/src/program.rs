//! A loaded eBPF program: an object's maps and its verified hook programs, ready to run. (The
//! CLI calls the installed one "the policy"; the core's `policy::Policy` is the Rust trait.)

use crate::ctx::Hook;
use crate::elf::{self, BpfObject, ElfError};
use crate::helpers::{CallEnv, QueueTable, with_env};
use crate::maps::{Map, MapError, MapSnapshot};
use crate::verifier::{self, Limits, Verified, VerifyError};
use crate::vm::{ExecMode, HookProgram, VmError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LoadError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// Not a `source`: the message already carries it, and error reporters print both.
    #[error("verifier rejected the program: {0}")]
    Verify(VerifyError),
    #[error(transparent)]
    Map(#[from] MapError),
    #[error(transparent)]
    Vm(#[from] VmError),
}

impl From<VerifyError> for LoadError {
    fn from(e: VerifyError) -> Self {
        LoadError::Verify(e)
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    pub limits: Limits,
    pub mode: ExecMode,
}

/// What `policy show` prints about one hook program.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProgramInfo {
    pub hook: Hook,
    pub section: &'static str,
    #[serde(flatten)]
    pub verified: Verified,
    pub mode: ExecMode,
}

pub struct BpfProgram {
    name: String,
    // `programs` hold the address ranges of `maps`' arenas; the arenas never move.
    maps: Vec<Map>,
    programs: [Option<HookProgram>; 4],
}

impl std::fmt::Debug for BpfProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfProgram")
            .field("name", &self.name)
            .field("maps", &self.maps.iter().map(Map::name).collect::<Vec<_>>())
            .field(
                "hooks",
                &self.programs().iter().map(|p| p.hook).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl BpfProgram {
    /// Parses, verifies and prepares an object file's bytes. Nothing runs on failure.
    pub fn load(name: &str, bytes: &[u8], opts: LoadOptions) -> Result<Self, LoadError> {
        let object = elf::parse(bytes)?;
        Self::from_object(name, object, opts)
    }

    pub fn from_object(
        name: &str,
        object: BpfObject,
        opts: LoadOptions,
    ) -> Result<Self, LoadError> {
        // Verify everything before allocating maps or building VMs.
        let mut checked = Vec::new();
        for p in &object.programs {
            checked.push(verifier::verify(
                p.hook,
                &p.code,
                &object.maps,
                opts.limits,
            )?);
        }
        let mut maps = object
            .maps
            .iter()
            .map(|d| Map::new(d.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let regions: Vec<_> = maps.iter_mut().map(Map::value_region).collect();
        let mut programs: [Option<HookProgram>; 4] = Default::default();
        for (p, v) in object.programs.into_iter().zip(checked) {
            let hook = p.hook;
            programs[hook.index()] = Some(HookProgram::new(hook, p.code, v, &regions, opts.mode)?);
        }
        tracing::info!(policy = name, maps = maps.len(), "eBPF policy loaded");
        Ok(Self {
            name: name.to_string(),
            maps,
            programs,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn maps(&self) -> &[Map] {
        &self.maps
    }

    pub fn map(&self, name: &str) -> Option<&Map> {
        self.maps.iter().find(|m| m.name() == name)
    }

    pub fn map_mut(&mut self, name: &str) -> Option<&mut Map> {
        self.maps.iter_mut().find(|m| m.name() == name)
    }

    pub fn has(&self, hook: Hook) -> bool {
        self.programs[hook.index()].is_some()
    }

    pub fn programs(&self) -> Vec<ProgramInfo> {
        self.programs
            .iter()
            .flatten()
            .map(|p| ProgramInfo {
                hook: p.hook(),
                section: p.hook().section(),
                verified: p.verified(),
                mode: p.mode(),
            })
            .collect()
    }

    /// Loads pinned contents into the maps of the same name and definition; returns the names
    /// of pinned maps that did not fit (they are left empty).
    pub fn restore(&mut self, snapshots: &[MapSnapshot]) -> Vec<String> {
        let mut skipped = Vec::new();
        for s in snapshots {
            match self.map_mut(&s.def.name) {
                Some(m) => {
                    if let Err(e) = s.restore_into(m) {
                        tracing::warn!("{e}");
                        skipped.push(s.def.name.clone());
                    }
                }
                None => skipped.push(s.def.name.clone()),
            }
        }
        skipped
    }

    /// Runs `hook`'s program on `ctx`; `Ok(None)` if the policy has none.
    pub fn run(
        &mut self,
        hook: Hook,
        ctx: &mut [u8],
        queues: &QueueTable,
        now: u64,
    ) -> Result<Option<u64>, VmError> {
        let Some(program) = self.programs[hook.index()].as_ref() else {
            return Ok(None);
        };
        let mut env = CallEnv {
            maps: &mut self.maps,
            queues,
            now,
            hook,
        };
        // Defence in depth: the verifier rules out every input known to make rbpf panic, but a
        // panic inside the VM must not take the scheduler down; it counts as a failed run.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_env(&mut env, || program.run(ctx))
        }));
        match run {
            Ok(r) => r.map(Some),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(VmError::Panic { hook, msg })
            }
        }
    }
}

#[cfg(test)]
impl BpfProgram {
    /// A policy whose program skipped our verifier (rbpf's own checks still apply): the only
    /// way to make a program fail at run time, to test what happens then.
    pub(crate) fn unverified(name: &str, hook: Hook, code: Vec<u8>) -> Self {
        let v = Verified {
            insns: code.len() / 8,
            longest_path: 0,
        };
        let mut programs: [Option<HookProgram>; 4] = Default::default();
        programs[hook.index()] = Some(
            HookProgram::new(hook, code, v, &[], ExecMode::Interpreter).expect("rbpf accepts it"),
        );
        Self {
            name: name.into(),
            maps: Vec::new(),
            programs,
        }
    }
}
