//! The C header and the Rust structs agree: a C compiler prints every offset and size the
//! header gives, and they must equal Rust's.

use std::process::Command;

#[test]
fn c_header_and_rust_structs_have_the_same_layout() {
    let table = xpreempt_bpf::ctx::layout_table();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xpreempt_bpf.h\"\nint main(void) {\n",
    );
    for (st, field, _, _) in &table {
        if *field == "sizeof" {
            c += &format!("printf(\"{st} sizeof 0 %zu\\n\", sizeof(struct {st}));\n");
        } else {
            c += &format!(
                "printf(\"{st} {field} %zu %zu\\n\", offsetof(struct {st}, {field}), sizeof(((struct {st} *)0)->{field}));\n"
            );
        }
    }
    c += "return 0; }\n";
    let dir = std::env::temp_dir().join(format!("xpreempt-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(include)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` ({e}): install gcc or set CC")
        });
    assert!(
        built.status.success(),
        "compiling the header failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let expected: String = table
        .iter()
        .map(|(st, f, off, size)| format!("{st} {f} {off} {size}\n"))
        .collect();
    assert_eq!(printed, expected);
    let _ = std::fs::remove_dir_all(&dir);
}
