//! Facts about NVIDIA's kernel driver that more than one layer checks (the CUDA backend's Lv3,
//! the shim's RM hooks): which driver is loaded, and on which ones the RM ABI was measured.

/// Where the loaded kernel module says its version.
pub const VERSION_FILE: &str = "/proc/driver/nvidia/version";

/// The driver branch on which the RM ABI facts (channel-group classes, control commands) were
/// measured (580.159.04 on an H100); its patch releases are taken to keep them.
pub const MEASURED_BRANCH: &str = "580.159.";

/// Whether `version` belongs to [`MEASURED_BRANCH`].
pub fn is_measured(version: &str) -> bool {
    version.starts_with(MEASURED_BRANCH)
}

/// The version in the first line of [`VERSION_FILE`] ("… Kernel Module … 580.159.04 …").
pub fn kernel_module_version(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let at = line.find("Kernel Module")?;
    line[at..]
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_string)
}

/// The loaded module's version, if the file is there and says one.
pub fn loaded_kernel_module_version() -> Option<String> {
    kernel_module_version(&std::fs::read_to_string(VERSION_FILE).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_from_the_first_line() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22-I3-AE18-09-3)  Tue Oct  7 2025\nGCC version:  gcc version 12.3.0";
        assert_eq!(kernel_module_version(open).as_deref(), Some("580.159.04"));
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024";
        assert_eq!(
            kernel_module_version(proprietary).as_deref(),
            Some("550.54.14")
        );
        assert_eq!(kernel_module_version("garbage"), None);
        assert_eq!(kernel_module_version(""), None);
        assert!(is_measured("580.159.04") && is_measured("580.159.11"));
        assert!(!is_measured("580.15.04") && !is_measured("590.1.2"));
    }
}
