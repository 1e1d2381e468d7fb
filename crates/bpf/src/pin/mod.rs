//! The installed policy and its pinned maps, kept in a state directory so that the CLI (which
//! exits after each command) and the scheduler (the simulator today, the daemon later) share
//! them, as bpffs pinning does for Linux's eBPF.
//!
//! ```text
//! $XPREEMPT_STATE_DIR                 (default $XDG_RUNTIME_DIR/xpreempt, else /tmp/xpreempt-$UID)
//! ├── policy/current.o                the installed object, as loaded (verified before copying)
//! ├── policy/current.json             name, source path, hooks with their verified bounds, maps
//! └── maps/NAME.json                  one pinned map: its definition and entries (hex)
//! ```
//!
//! Installing an object keeps the entries of pinned maps whose name and definition are
//! unchanged (a reload keeps the configuration), starts the others empty and unpins maps the
//! new object lacks. Every file is written to a temporary name and renamed into place, so a
//! reader sees the old or the new file, never half of one. There is no lock: two writers of the
//! same map race, the last rename wins.

use crate::maps::{Map, MapDef, MapSnapshot};
use crate::program::{BpfProgram, LoadError, LoadOptions, ProgramInfo};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PinError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("no policy is installed in {0} (run `xpreempt policy load FILE.o`)")]
    NotInstalled(PathBuf),
    #[error("no pinned map `{name}` in {dir}; pinned: {known}")]
    NoMap {
        name: String,
        dir: PathBuf,
        known: String,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PinError + '_ {
    move |source| PinError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What `current.json` records about the installed policy.
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
        Self::new(std::env::temp_dir().join(format!("xpreempt-{}", uid())))
    }

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

    /// Verifies `bytes` and, only if they pass, installs them with their maps pinned.
    pub fn install(
        &self,
        name: &str,
        source: &str,
        bytes: &[u8],
    ) -> Result<(Installed, BpfProgram), PinError> {
        let mut policy = BpfProgram::load(name, bytes, LoadOptions::default())?;
        // Keep the configuration of maps that survive the reload.
        let old = self.snapshots()?;
        policy.restore(&old);
        std::fs::create_dir_all(self.root.join("policy")).map_err(io(&self.root))?;
        std::fs::create_dir_all(self.maps_dir()).map_err(io(&self.root))?;
        for s in &old {
            if policy.map(&s.def.name).is_none() {
                let p = self.map_path(&s.def.name);
                std::fs::remove_file(&p).map_err(io(&p))?;
            }
        }
        self.save_maps(&policy)?;
        write_atomic(&self.object_path(), bytes)?;
        let installed = Installed {
            name: name.to_string(),
            source: source.to_string(),
            size: bytes.len() as u64,
            hooks: policy.programs().iter().map(hook_json).collect(),
            maps: policy.maps().iter().map(|m| m.def().clone()).collect(),
        };
        let meta = serde_json::to_vec_pretty(&installed).map_err(|e| PinError::Format {
            path: self.meta_path(),
            msg: e.to_string(),
        })?;
        write_atomic(&self.meta_path(), &meta)?;
        Ok((installed, policy))
    }

    pub fn installed(&self) -> Result<Installed, PinError> {
        let p = self.meta_path();
        let text = match std::fs::read(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PinError::NotInstalled(self.root.clone()));
            }
            Err(e) => return Err(io(&p)(e)),
        };
        serde_json::from_slice(&text).map_err(|e| PinError::Format {
            path: p,
            msg: e.to_string(),
        })
    }

    /// The installed policy, with its pinned map contents: what the scheduler runs.
    pub fn load_installed(&self, opts: LoadOptions) -> Result<BpfProgram, PinError> {
        let meta = self.installed()?;
        let p = self.object_path();
        let bytes = std::fs::read(&p).map_err(io(&p))?;
        let mut policy = BpfProgram::load(&meta.name, &bytes, opts)?;
        policy.restore(&self.snapshots()?);
        Ok(policy)
    }

    /// Every pinned map (none if the directory does not exist).
    pub fn snapshots(&self) -> Result<Vec<MapSnapshot>, PinError> {
        let dir = self.maps_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io(&dir))?.path();
            if path.extension().is_some_and(|x| x == "json") {
                out.push(read_snapshot(&path)?);
            }
        }
        out.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        Ok(out)
    }

    /// The pinned map `name`, as a live map.
    pub fn map(&self, name: &str) -> Result<Map, PinError> {
        let path = self.map_path(name);
        if !valid_name(name) || !path.is_file() {
            let known = self
                .snapshots()?
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
        let snap = read_snapshot(&path)?;
        let bad = |msg: String| PinError::Format {
            path: path.clone(),
            msg,
        };
        let mut map = Map::new(snap.def.clone()).map_err(|e| bad(e.to_string()))?;
        snap.restore_into(&mut map).map_err(bad)?;
        Ok(map)
    }

    pub fn save_map(&self, map: &Map) -> Result<(), PinError> {
        let path = self.map_path(map.name());
        let text =
            serde_json::to_vec_pretty(&MapSnapshot::of(map)).map_err(|e| PinError::Format {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        write_atomic(&path, &text)
    }

    /// Writes back every map of `policy` (after a run, so the CLI sees what the program
    /// learned).
    pub fn save_maps(&self, policy: &BpfProgram) -> Result<(), PinError> {
        for m in policy.maps() {
            if valid_name(m.name()) {
                self.save_map(m)?;
            }
        }
        Ok(())
    }
}

fn hook_json(p: &ProgramInfo) -> serde_json::Value {
    serde_json::to_value(p).unwrap_or(serde_json::Value::Null)
}

/// Map names become file names: keep them to what C identifiers allow.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn read_snapshot(path: &Path) -> Result<MapSnapshot, PinError> {
    let text = std::fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&text).map_err(|e| PinError::Format {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PinError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn uid() -> String {
    // No libc dependency: the owner of /proc/self is this process's uid.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata("/proc/self") {
            return m.uid().to_string();
        }
    }
    std::env::var("USER").unwrap_or_else(|_| "user".into())
}
