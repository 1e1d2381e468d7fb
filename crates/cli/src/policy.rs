//! `xpreempt policy`: install an eBPF policy object and read or write its pinned maps.
//!
//! The installed object and its maps live in the state directory (`--state-dir`,
//! XPREEMPT_STATE_DIR, default `$XDG_RUNTIME_DIR/xpreempt` or `/tmp/xpreempt-$UID`); see
//! `xpreempt_bpf::pin` for the layout. Keys and values of up to 8 bytes are integers (decimal,
//! negative, or 0x-prefixed hex), little-endian in the map's size; longer ones are hex bytes or
//! comma-separated 64-bit words.

use crate::output::Output;
use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use std::path::PathBuf;
use xpreempt_bpf::maps::{MapDef, UPDATE_ANY, to_hex};
use xpreempt_bpf::pin::{PinError, StateDir};
use xpreempt_bpf::{BpfHooks, LoadOptions};
use xpreempt_core::sched::Hooks;

#[derive(clap::Args)]
pub struct Args {
    /// Where the installed policy and pinned maps live.
    #[arg(long, global = true, env = "XPREEMPT_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Read and write the maps of the program the running daemon executes (live) instead of the
    /// state directory's pinned maps.
    #[arg(long, global = true)]
    daemon: bool,
    /// The daemon's socket (with --daemon).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Verify an object built with `clang -target bpf` and install it (its maps are pinned).
    Load { file: PathBuf },
    /// The installed policy: hooks with their verified bounds, maps with their sizes.
    Show,
    /// Read or write a pinned map.
    Map {
        #[command(subcommand)]
        command: MapCmd,
    },
}

#[derive(clap::Subcommand)]
enum MapCmd {
    /// Every entry of MAP.
    Dump { map: String },
    /// The value stored under KEY.
    Get { map: String, key: String },
    /// Store VALUE under KEY.
    Set {
        map: String,
        #[arg(allow_hyphen_values = true)]
        key: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Remove KEY (hash maps).
    Delete { map: String, key: String },
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    if args.daemon {
        let path = args
            .socket
            .clone()
            .unwrap_or_else(xpreempt_ipc::default_socket);
        let mut op = xpreempt_ipc::operator::Operator::connect(&path)?;
        return match &args.command {
            Cmd::Map { command } => live_map(out, &mut op, command),
            Cmd::Show => live_show(out, &mut op),
            Cmd::Load { .. } => bail!(
                "a running daemon's program is chosen when it starts: `xpreempt daemon --policy FILE.o`"
            ),
        };
    }
    let state = args
        .state_dir
        .clone()
        .map_or_else(StateDir::from_env, StateDir::new);
    match &args.command {
        Cmd::Load { file } => load(out, &state, file),
        Cmd::Show => show(out, &state),
        Cmd::Map { command } => map(out, &state, command),
    }
}

/// Whether `--policy` names an eBPF object rather than a built-in policy.
pub fn is_object(arg: &str) -> bool {
    arg.ends_with(".o") || std::path::Path::new(arg).is_file()
}

/// Hooks for `xpreempt sim --policy FILE.o`: the object, verified, with the pinned maps of the
/// state directory (XPREEMPT_STATE_DIR) loaded into each run's fresh copy of its maps.
pub fn sim_hooks(
    file: &str,
    state_dir: Option<&std::path::Path>,
) -> Result<Box<dyn Fn() -> Box<dyn Hooks>>> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    let state = state_dir.map_or_else(StateDir::from_env, |d| StateDir::new(d.to_path_buf()));
    let pinned = match state.snapshots() {
        Ok(p) => p,
        // A directory someone else controls must stop the run, not quietly configure it.
        Err(e @ PinError::Unsafe { .. }) => return Err(e.into()),
        Err(e) => {
            tracing::warn!("pinned maps not used: {:#}", anyhow::Error::from(e));
            Vec::new()
        }
    };
    let name = std::path::Path::new(file)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("policy");
    let make = BpfHooks::factory(name, bytes, pinned, LoadOptions::default())
        .with_context(|| format!("eBPF policy {file}"))?;
    Ok(Box::new(make))
}

fn load(out: &Output, state: &StateDir, file: &PathBuf) -> Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("policy")
        .to_string();
    let (installed, _) = state
        .install(&name, &file.display().to_string(), &bytes)
        .with_context(|| {
            format!(
                "{} not installed (the previous policy stays)",
                file.display()
            )
        })?;
    #[derive(Serialize)]
    struct Loaded<'a> {
        state_dir: String,
        #[serde(flatten)]
        installed: &'a xpreempt_bpf::pin::Installed,
    }
    let v = Loaded {
        state_dir: state.root().display().to_string(),
        installed: &installed,
    };
    out.emit(&v, || {
        format!(
            "installed {} ({} hooks, {} maps) in {}\n",
            installed.name,
            installed.hooks.len(),
            installed.maps.len(),
            state.root().display()
        )
    })
}

fn show(out: &Output, state: &StateDir) -> Result<()> {
    let installed = state.installed()?;
    let snaps = state.snapshots()?;
    #[derive(Serialize)]
    struct MapRow {
        #[serde(flatten)]
        def: MapDef,
        entries: usize,
    }
    #[derive(Serialize)]
    struct Show<'a> {
        state_dir: String,
        name: &'a str,
        source: &'a str,
        hooks: &'a [serde_json::Value],
        maps: Vec<MapRow>,
    }
    let maps = snaps
        .into_iter()
        .map(|s| MapRow {
            entries: s.entries.len(),
            def: s.def,
        })
        .collect();
    let v = Show {
        state_dir: state.root().display().to_string(),
        name: &installed.name,
        source: &installed.source,
        hooks: &installed.hooks,
        maps,
    };
    out.emit(&v, || {
        let mut t = format!("policy {} (from {})\n", v.name, v.source);
        t += "hook          insns  longest path\n";
        for h in v.hooks {
            t += &format!(
                "{:<12} {:>6} {:>13}\n",
                h["hook"].as_str().unwrap_or("?"),
                h["insns"].as_u64().unwrap_or(0),
                h["longest_path"].as_u64().unwrap_or(0)
            );
        }
        t += "map                   kind   key  value    max  entries\n";
        for m in &v.maps {
            t += &format!(
                "{:<20} {:<6} {:>4} {:>6} {:>6} {:>8}\n",
                m.def.name,
                format!("{:?}", m.def.kind).to_lowercase(),
                m.def.key_size,
                m.def.value_size,
                m.def.max_entries,
                m.entries
            );
        }
        t
    })
}

#[derive(Serialize)]
struct Entry {
    key: String,
    value: String,
    key_hex: String,
    value_hex: String,
    /// The key is a channel group's queue id (the RM hooks'): its process, device and TSG.
    #[serde(skip_serializing_if = "Option::is_none")]
    channel_group: Option<RmKey>,
}

#[derive(Serialize)]
struct RmKey {
    pid: u32,
    device: u32,
    tsg: u32,
}

fn entry(k: &[u8], v: &[u8]) -> Entry {
    let channel_group = <[u8; 8]>::try_from(k)
        .ok()
        .and_then(|b| xpreempt_bpf::rm::decode_rm_queue_id(u64::from_le_bytes(b)))
        .map(|q| RmKey {
            pid: q.pid,
            device: q.device,
            tsg: q.tsg,
        });
    Entry {
        key: show_bytes(k),
        value: show_bytes(v),
        key_hex: to_hex(k),
        value_hex: to_hex(v),
        channel_group,
    }
}

impl Entry {
    /// The key as a person reads it: a channel group as `pid P dev D tsg T`.
    fn key_text(&self) -> String {
        match &self.channel_group {
            Some(g) => format!("pid {} dev {} tsg {}", g.pid, g.device, g.tsg),
            None => self.key.clone(),
        }
    }
}

fn map(out: &Output, state: &StateDir, cmd: &MapCmd) -> Result<()> {
    match cmd {
        MapCmd::Dump { map } => {
            let m = state.map(map)?;
            let entries: Vec<Entry> = m.entries().iter().map(|(k, v)| entry(k, v)).collect();
            #[derive(Serialize)]
            struct Dump<'a> {
                map: &'a MapDef,
                entries: &'a [Entry],
            }
            out.emit(
                &Dump {
                    map: m.def(),
                    entries: &entries,
                },
                || {
                    entries
                        .iter()
                        .map(|e| format!("{}\t{}\n", e.key_text(), e.value))
                        .collect()
                },
            )
        }
        MapCmd::Get { map, key } => {
            let m = state.map(map)?;
            let k = parse_bytes(key, m.def().key_size).context("key")?;
            let v = m.get(&k)?;
            let e = entry(&k, &v);
            out.emit(&e, || format!("{}\n", e.value))
        }
        MapCmd::Set { map, key, value } => {
            let def = state.map(map)?.def().clone();
            let k = parse_bytes(key, def.key_size).context("key")?;
            let v = parse_bytes(value, def.value_size).context("value")?;
            // Under the state directory's lock: concurrent `map set`s all land.
            state.update_map(map, |m| m.update(&k, &v, UPDATE_ANY))?;
            let e = entry(&k, &v);
            out.emit(&e, || format!("{}[{}] = {}\n", map, e.key, e.value))
        }
        MapCmd::Delete { map, key } => {
            let key_size = state.map(map)?.def().key_size;
            let k = parse_bytes(key, key_size).context("key")?;
            state.update_map(map, |m| m.delete(&k))?;
            out.emit(&serde_json::json!({ "deleted": show_bytes(&k) }), || {
                format!("{map}[{}] deleted\n", show_bytes(&k))
            })
        }
    }
}

/// `policy --daemon show`: the policy the daemon runs, each device's, and its program's maps.
/// A built-in policy has no maps: it says which one runs rather than print nothing.
fn live_show(out: &Output, op: &mut xpreempt_ipc::operator::Operator) -> Result<()> {
    let stats = op.stats()?;
    let maps = op.policy_maps()?;
    #[derive(Serialize)]
    struct Device {
        device: u32,
        policy: String,
    }
    #[derive(Serialize)]
    struct LiveShow {
        policy: String,
        devices: Vec<Device>,
        maps: Vec<xpreempt_ipc::msg::PolicyMap>,
    }
    let v = LiveShow {
        policy: stats.policy,
        devices: stats
            .devices
            .into_iter()
            .map(|d| Device {
                device: d.device,
                policy: d.policy,
            })
            .collect(),
        maps,
    };
    out.emit(&v, || {
        let mut t = format!("policy: {}\n", v.policy);
        if v.devices.is_empty() {
            t.push_str("no device yet: each opens with its first queue, under this policy\n");
        }
        for d in &v.devices {
            t.push_str(&format!("device {}: {}\n", d.device, d.policy));
        }
        if v.maps.is_empty() {
            t.push_str("no eBPF program maps\n");
        }
        for m in &v.maps {
            t.push_str(&format!(
                "device {}  {}  {} entries\n",
                m.device,
                m.map,
                m.entries.len()
            ));
        }
        t
    })
}

/// `policy --daemon map …`: the live maps of the daemon's program (one per device).
fn live_map(out: &Output, op: &mut xpreempt_ipc::operator::Operator, cmd: &MapCmd) -> Result<()> {
    let maps = op.policy_maps()?;
    let name = match cmd {
        MapCmd::Dump { map }
        | MapCmd::Get { map, .. }
        | MapCmd::Set { map, .. }
        | MapCmd::Delete { map, .. } => map,
    };
    let Some(first) = maps.iter().find(|m| &m.map == name) else {
        bail!("the daemon's program has no map `{name}` (or no device runs one yet)");
    };
    let (key_size, value_size) = (first.key_size, first.value_size);
    match cmd {
        MapCmd::Dump { .. } => {
            #[derive(Serialize)]
            struct Row {
                device: u32,
                #[serde(flatten)]
                entry: Entry,
            }
            let rows: Vec<Row> = maps
                .iter()
                .filter(|m| &m.map == name)
                .flat_map(|m| {
                    m.entries.iter().map(|(k, v)| Row {
                        device: m.device,
                        entry: entry(k, v),
                    })
                })
                .collect();
            // One object, as every `--json` output: the map's name and its rows of every device.
            out.emit(&serde_json::json!({ "map": name, "entries": rows }), || {
                rows.iter()
                    .map(|r| {
                        format!(
                            "device {}\t{}\t{}\n",
                            r.device,
                            r.entry.key_text(),
                            r.entry.value
                        )
                    })
                    .collect()
            })
        }
        MapCmd::Get { key, .. } => {
            let k = parse_bytes(key, key_size).context("key")?;
            let found: Vec<Entry> = maps
                .iter()
                .filter(|m| &m.map == name)
                .filter_map(|m| m.entries.iter().find(|(mk, _)| *mk == k))
                .map(|(k, v)| entry(k, v))
                .collect();
            let Some(e) = found.first() else {
                bail!("{name}: no entry {key}");
            };
            out.emit(e, || format!("{}\n", e.value))
        }
        MapCmd::Set { key, value, .. } => {
            let k = parse_bytes(key, key_size).context("key")?;
            let v = parse_bytes(value, value_size).context("value")?;
            let n = op.policy_map_update(name, k.clone(), Some(v.clone()))?;
            let e = entry(&k, &v);
            out.emit(&e, || {
                format!("{name}[{}] = {} on {n} device(s)\n", e.key, e.value)
            })
        }
        MapCmd::Delete { key, .. } => {
            let k = parse_bytes(key, key_size).context("key")?;
            let n = op.policy_map_update(name, k.clone(), None)?;
            out.emit(
                &serde_json::json!({ "deleted": show_bytes(&k), "devices": n }),
                || format!("{name}[{}] deleted on {n} device(s)\n", show_bytes(&k)),
            )
        }
    }
}

/// Integers for sizes up to 8 bytes (shown signed, as a C `int`/`long` would print), 64-bit
/// words for multiples of 8, hex otherwise.
fn show_bytes(b: &[u8]) -> String {
    match b.len() {
        1 => (b[0] as i8).to_string(),
        2 => i16::from_le_bytes([b[0], b[1]]).to_string(),
        4 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_string(),
        8 => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])).to_string(),
        n if n % 8 == 0 => b
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])).to_string())
            .collect::<Vec<_>>()
            .join(","),
        _ => format!("0x{}", to_hex(b)),
    }
}

fn parse_bytes(text: &str, size: u32) -> Result<Vec<u8>> {
    let size = size as usize;
    let t = text.trim();
    if size <= 8 {
        let v: i128 = if let Some(h) = t.strip_prefix("0x") {
            i128::from_str_radix(h, 16).with_context(|| format!("`{t}` is not a hex integer"))?
        } else {
            t.parse().map_err(|_| anyhow!("`{t}` is not an integer"))?
        };
        let bits = 8 * size as u32;
        let fits = v >= -(1i128 << (bits - 1)) && v < (1i128 << bits);
        if !fits {
            bail!("{v} does not fit in {size} bytes");
        }
        return Ok(v.to_le_bytes()[..size].to_vec());
    }
    if t.contains(',') || (size.is_multiple_of(8) && !t.starts_with("0x")) {
        let words: Vec<u64> = t
            .split(',')
            .map(|w| {
                w.trim()
                    .parse::<u64>()
                    .map_err(|_| anyhow!("`{w}` is not a 64-bit word"))
            })
            .collect::<Result<_>>()?;
        if words.len() * 8 != size {
            bail!(
                "{} words given, the map wants {} bytes ({} words)",
                words.len(),
                size,
                size / 8
            );
        }
        return Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect());
    }
    let b = xpreempt_bpf::maps::from_hex(t)?;
    if b.len() != size {
        bail!("{} bytes given, the map wants {size}", b.len());
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_print_in_the_map_size() {
        assert_eq!(parse_bytes("-3", 4).unwrap(), (-3i32).to_le_bytes());
        assert_eq!(parse_bytes("0x10", 8).unwrap(), 16u64.to_le_bytes());
        assert!(parse_bytes("300", 1).is_err());
        assert!(parse_bytes("abc", 4).is_err());
        assert_eq!(parse_bytes("1,2", 16).unwrap().len(), 16);
        assert!(parse_bytes("1,2", 24).is_err());
        assert_eq!(parse_bytes("0x0102", 2).unwrap(), vec![2, 1]);
        assert_eq!(show_bytes(&(-3i32).to_le_bytes()), "-3");
        assert_eq!(
            show_bytes(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]),
            "1,2"
        );
        assert_eq!(show_bytes(&[1, 2, 3]), "0x010203");
    }

    #[test]
    fn channel_group_keys_name_their_process() {
        let id = xpreempt_bpf::rm::rm_queue_id(4242, 0, 7);
        let e = entry(&id.to_le_bytes(), &1u32.to_le_bytes());
        assert_eq!(e.key_text(), "pid 4242 dev 0 tsg 7");
        assert_eq!(entry(&5u64.to_le_bytes(), &[0; 4]).key_text(), "5");
    }
}
