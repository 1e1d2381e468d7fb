//! The installed program and its pinned maps, kept in a state directory so that the CLI (which
//! exits after each command) and the scheduler (the simulator today, the daemon later) share
//! them, as bpffs pinning does for Linux's eBPF.
//!
//! ```text
//! $XPREEMPT_STATE_DIR                 (default $XDG_RUNTIME_DIR/xpreempt, else /tmp/xpreempt-$UID)
//! ├── lock                            flock(2): writers exclusive, multi-file readers shared
//! ├── policy/current.o                the installed object, as loaded (verified before copying)
//! ├── policy/current.json             name, source path, hooks with their verified bounds, maps
//! └── maps/NAME.json                  one pinned map: its definition and entries (hex)
//! ```
//!
//! The directory is trusted only if this user owns it and nobody else may write to it (see
//! [`UnsafeDir`]). Installing an object keeps the entries of pinned maps whose name and definition
//! are unchanged (a reload keeps the configuration), starts the others empty and unpins maps the
//! new object lacks. Every change is a read-modify-write under the exclusive lock, and every
//! file is written to a temporary name and renamed into place, so concurrent writers never lose
//! an update and a reader sees the old or the new file, never half of one.

mod guard;

use crate::hooks::BpfHooks;
use crate::maps::{Map, MapDef, MapError, MapSnapshot, SnapshotError};
use crate::program::{BpfProgram, LoadError, LoadOptions, ProgramInfo};
use guard::{DirLock, check_root, write_atomic};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

pub use guard::UnsafeDir;

#[derive(Debug, Error)]
pub enum PinError {
    #[error(
        "refusing the state directory {path}: {why}; remove it, or choose another with \
         --state-dir or XPREEMPT_STATE_DIR"
    )]
    Unsafe { path: PathBuf, why: UnsafeDir },
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid {what}")]
    Json {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: the pinned map cannot be used")]
    Snapshot {
        path: PathBuf,
        #[source]
        source: SnapshotError,
    },
    #[error("{path}: the pinned map's definition is invalid")]
    Definition {
        path: PathBuf,
        #[source]
        source: MapError,
    },
    #[error(
        "{path} holds map `{inside}`, not `{file}`: a pinned map's file must be named after the \
         map; rename it to {inside}.json or remove it"
    )]
    NameMismatch {
        path: PathBuf,
        file: String,
        inside: String,
    },
    #[error("`{0}` cannot be pinned: map names are ASCII letters, digits and `_`")]
    BadName(String),
    #[error("no policy is installed in {0} (run `xpreempt policy load FILE.o`)")]
    NotInstalled(PathBuf),
    #[error("no pinned map `{name}` in {dir}; pinned: {known}")]
    NoMap {
        name: String,
        dir: PathBuf,
        known: String,
    },
    #[error(transparent)]
    Map(#[from] MapError),
    #[error(transparent)]
    Load(#[from] LoadError),
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PinError + 'a {
    move |source| PinError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What `current.json` records about the installed program.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Installed {
    pub name: String,
    pub source: String,
    pub size: u64,
    pub hooks: Vec<serde_json::Value>,
    pub maps: Vec<MapDef>,
}

#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// `XPREEMPT_STATE_DIR`, else `$XDG_RUNTIME_DIR/xpreempt`, else `/tmp/xpreempt-$UID`.
    pub fn from_env() -> Self {
        if let Some(dir) = std::env::var_os("XPREEMPT_STATE_DIR").filter(|d| !d.is_empty()) {
            return Self::new(dir);
        }
        if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            return Self::new(Path::new(&dir).join("xpreempt"));
        }
        Self::new(std::env::temp_dir().join(format!("xpreempt-{}", guard::euid())))
    }

    /// A state directory at `root`. Nothing is checked or created until it is used.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn object_path(&self) -> PathBuf {
        self.root.join("policy/current.o")
    }

    fn meta_path(&self) -> PathBuf {
        self.root.join("policy/current.json")
    }

    fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }

    fn map_path(&self, name: &str) -> PathBuf {
        self.maps_dir().join(format!("{name}.json"))
    }

    /// The exclusive lock, after making sure the directory exists and is safe.
    fn lock_for_write(&self) -> Result<DirLock, PinError> {
        check_root(&self.root, true)?;
        DirLock::take(&self.root, true)
    }

    /// The shared lock, or `None` if the directory does not exist (so there is nothing to
    /// read); reading never creates it.
    fn lock_for_read(&self) -> Result<Option<DirLock>, PinError> {
        if !check_root(&self.root, false)? {
            return Ok(None);
        }
        DirLock::take(&self.root, false).map(Some)
    }

    /// Verifies `bytes` and, only if they pass, installs them with their maps pinned.
    pub fn install(
        &self,
        name: &str,
        source: &str,
        bytes: &[u8],
    ) -> Result<(Installed, BpfProgram), PinError> {
        let mut program = BpfProgram::load(name, bytes, LoadOptions::default())?;
        let _lock = self.lock_for_write()?;
        // Keep the configuration of maps that survive the reload.
        let old = self.read_snapshots()?;
        program.restore(&old);
        for s in &old {
            if program.map(&s.def.name).is_none() {
                let p = self.map_path(&s.def.name);
                std::fs::remove_file(&p).map_err(io("remove", &p))?;
            }
        }
        self.write_maps(&program)?;
        write_atomic(&self.object_path(), bytes)?;
        let installed = Installed {
            name: name.to_string(),
            source: source.to_string(),
            size: bytes.len() as u64,
            hooks: program.programs().iter().map(hook_json).collect(),
            maps: program.maps().iter().map(|m| m.def().clone()).collect(),
        };
        let meta = serde_json::to_vec_pretty(&installed).map_err(|source| PinError::Json {
            path: self.meta_path(),
            what: "installation record",
            source,
        })?;
        write_atomic(&self.meta_path(), &meta)?;
        Ok((installed, program))
    }

    pub fn installed(&self) -> Result<Installed, PinError> {
        let Some(_lock) = self.lock_for_read()? else {
            return Err(PinError::NotInstalled(self.root.clone()));
        };
        self.read_installed()
    }

    fn read_installed(&self) -> Result<Installed, PinError> {
        let p = self.meta_path();
        let text = match std::fs::read(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PinError::NotInstalled(self.root.clone()));
            }
            Err(e) => return Err(io("read", &p)(e)),
        };
        serde_json::from_slice(&text).map_err(|source| PinError::Json {
            path: p,
            what: "installation record",
            source,
        })
    }

    /// The installed program, with its pinned map contents: what the scheduler runs.
    pub fn load_installed(&self, opts: LoadOptions) -> Result<BpfProgram, PinError> {
        let Some(_lock) = self.lock_for_read()? else {
            return Err(PinError::NotInstalled(self.root.clone()));
        };
        let meta = self.read_installed()?;
        let p = self.object_path();
        let bytes = std::fs::read(&p).map_err(io("read", &p))?;
        let mut program = BpfProgram::load(&meta.name, &bytes, opts)?;
        program.restore(&self.read_snapshots()?);
        Ok(program)
    }

    /// Runs `f` on the installed program, its maps filled from the pinned ones, and pins what
    /// the program left in them, all under the exclusive lock: hooks run by several processes
    /// (the shim's RM hooks without a daemon) see each other's map updates and lose none. A
    /// program that failed during `f` was taken out by its hooks, and its half-done map writes
    /// are not pinned.
    pub fn with_installed<T>(
        &self,
        opts: LoadOptions,
        f: impl FnOnce(&mut BpfHooks) -> T,
    ) -> Result<T, PinError> {
        let _lock = self.lock_for_write()?;
        let meta = self.read_installed()?;
        let p = self.object_path();
        let bytes = std::fs::read(&p).map_err(io("read", &p))?;
        let mut program = BpfProgram::load(&meta.name, &bytes, opts)?;
        program.restore(&self.read_snapshots()?);
        let mut hooks = BpfHooks::new(program);
        let out = f(&mut hooks);
        if let Some(program) = hooks.program() {
            self.write_maps(program)?;
        }
        Ok(out)
    }

    /// Every pinned map (none if the directory does not exist).
    pub fn snapshots(&self) -> Result<Vec<MapSnapshot>, PinError> {
        match self.lock_for_read()? {
            Some(_lock) => self.read_snapshots(),
            None => Ok(Vec::new()),
        }
    }

    fn read_snapshots(&self) -> Result<Vec<MapSnapshot>, PinError> {
        let dir = self.maps_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("list", &dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io("list", &dir))?.path();
            let stem = path.file_stem().and_then(|s| s.to_str());
            if let Some(name) = stem.filter(|_| path.extension().is_some_and(|x| x == "json")) {
                out.push(read_snapshot(&path, name)?);
            }
        }
        out.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        Ok(out)
    }

    /// The pinned map `name`, as a live map.
    pub fn map(&self, name: &str) -> Result<Map, PinError> {
        check_root(&self.root, false)?;
        self.read_map(name)
    }

    fn read_map(&self, name: &str) -> Result<Map, PinError> {
        let path = self.map_path(name);
        if !valid_name(name) || !path.is_file() {
            let known = self
                .read_snapshots()?
                .iter()
                .map(|s| s.def.name.clone())
                .collect::<Vec<_>>();
            return Err(PinError::NoMap {
                name: name.to_string(),
                dir: self.maps_dir(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        }
        let snap = read_snapshot(&path, name)?;
        let mut map = Map::new(snap.def.clone()).map_err(|source| PinError::Definition {
            path: path.clone(),
            source,
        })?;
        snap.restore_into(&mut map)
            .map_err(|source| PinError::Snapshot { path, source })?;
        Ok(map)
    }

    /// Reads the pinned map `name`, lets `change` modify it and writes it back, all under the
    /// exclusive lock: concurrent updates (other keys, other processes) are all kept. Nothing
    /// is written if `change` fails.
    pub fn update_map<T>(
        &self,
        name: &str,
        change: impl FnOnce(&mut Map) -> Result<T, MapError>,
    ) -> Result<T, PinError> {
        let _lock = self.lock_for_write()?;
        let mut map = self.read_map(name)?;
        let out = change(&mut map)?;
        self.write_map(&map)?;
        Ok(out)
    }

    /// Pins `map` as it is, replacing what was pinned under its name.
    pub fn save_map(&self, map: &Map) -> Result<(), PinError> {
        let _lock = self.lock_for_write()?;
        self.write_map(map)
    }

    /// Writes back every map of `program` (after a run, so the CLI sees what the program
    /// learned).
    pub fn save_maps(&self, program: &BpfProgram) -> Result<(), PinError> {
        let _lock = self.lock_for_write()?;
        self.write_maps(program)
    }

    fn write_maps(&self, program: &BpfProgram) -> Result<(), PinError> {
        for m in program.maps() {
            if valid_name(m.name()) {
                self.write_map(m)?;
            } else {
                tracing::warn!(map = m.name(), "not pinned: the name cannot be a file name");
            }
        }
        Ok(())
    }

    fn write_map(&self, map: &Map) -> Result<(), PinError> {
        if !valid_name(map.name()) {
            return Err(PinError::BadName(map.name().to_string()));
        }
        let path = self.map_path(map.name());
        let text =
            serde_json::to_vec_pretty(&MapSnapshot::of(map)).map_err(|source| PinError::Json {
                path: path.clone(),
                what: "pinned map",
                source,
            })?;
        write_atomic(&path, &text)
    }
}

fn hook_json(p: &ProgramInfo) -> serde_json::Value {
    serde_json::to_value(p).unwrap_or(serde_json::Value::Null)
}

/// Map names become file names: keep them to what C identifiers allow.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads `maps/NAME.json`, which must hold the map `NAME`: the file name is how the CLI finds a
/// map and the name inside is how a program's map finds its contents, so they must agree.
fn read_snapshot(path: &Path, file_name: &str) -> Result<MapSnapshot, PinError> {
    let text = std::fs::read(path).map_err(io("read", path))?;
    let snap: MapSnapshot = serde_json::from_slice(&text).map_err(|source| PinError::Json {
        path: path.to_path_buf(),
        what: "pinned map",
        source,
    })?;
    if snap.def.name != file_name {
        return Err(PinError::NameMismatch {
            path: path.to_path_buf(),
            file: file_name.to_string(),
            inside: snap.def.name,
        });
    }
    Ok(snap)
}
