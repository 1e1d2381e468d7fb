//! Compiles the example policies (`policies/*.c`) and the test programs (`tests/bpf/*.c`) with
//! `clang -target bpf` into OUT_DIR. Without clang the crate still builds; what failed is passed
//! on as XPREEMPT_BPF_CLANG_ERROR so that tests needing an object fail with that message instead
//! of passing silently.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    let include = root.join("include");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!(
        "cargo:rerun-if-changed={}",
        include.join("xpreempt_bpf.h").display()
    );
    let mut errors = Vec::new();
    // Without a runnable clang one message says it all.
    let clang_ok = match Command::new(&clang).arg("--version").output() {
        Ok(_) => true,
        Err(e) => {
            errors.push(format!(
                "cannot run `{clang}` ({e}); install it: apt-get install -y clang"
            ));
            false
        }
    };
    for dir in [root.join("policies"), manifest.join("tests/bpf")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut sources: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "c"))
            .collect();
        sources.sort();
        for src in sources {
            println!("cargo:rerun-if-changed={}", src.display());
            let stale = out.join(src.with_extension("o").file_name().unwrap_or_default());
            if !clang_ok {
                // A stale object from an earlier build must not stand in for this one.
                let _ = std::fs::remove_file(stale);
            } else if let Err(e) = compile(&clang, &include, &src, &out) {
                errors.push(e);
            }
        }
    }
    println!("cargo:rustc-env=XPREEMPT_BPF_OBJ_DIR={}", out.display());
    let joined = errors.join(" | ").replace(['\n', '\r'], " ");
    if !joined.is_empty() {
        println!("cargo:warning=eBPF objects not built: {joined}");
    }
    println!("cargo:rustc-env=XPREEMPT_BPF_CLANG_ERROR={joined}");
}

fn compile(clang: &str, include: &Path, src: &Path, out: &Path) -> Result<(), String> {
    let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("policy");
    let obj = out.join(format!("{stem}.o"));
    // A stale object from an earlier build must not stand in for one that fails to build now.
    let _ = std::fs::remove_file(&obj);
    let result = Command::new(clang)
        .args(["-target", "bpf", "-mcpu=v3", "-O2", "-Wall", "-c"])
        .arg("-I")
        .arg(include)
        .arg(src)
        .arg("-o")
        .arg(&obj)
        .output();
    match result {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{} failed: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!(
            "cannot run `{clang}` ({e}); install it: apt-get install -y clang"
        )),
    }
}
