//! Facts about NVIDIA's kernel driver that more than one layer checks (the CUDA backend's Lv3,
//! the shim's RM hooks): which driver is loaded, on which ones the RM ABI was measured, and the
//! one check (with its one override) both use.

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

/// The one override of the driver check: `XPREEMPT_RM_FORCE=1` uses the RM controls (the Lv3
/// timeslice, the RM hooks) on a driver that is not a measured version.
pub const FORCE_VAR: &str = "XPREEMPT_RM_FORCE";

/// Why the RM controls stay off on this driver.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DriverError {
    #[error("cannot read the driver version from {VERSION_FILE}")]
    NoVersion,
    #[error(
        "driver {0} is not a measured version ({MEASURED_BRANCH}x); set XPREEMPT_RM_FORCE=1 to try anyway"
    )]
    Untested(String),
}

/// Whether the RM controls may act on the driver whose [`VERSION_FILE`] says `version_text`:
/// its version, or why not (`force`: [`forced`]).
pub fn check_driver(version_text: Option<&str>, force: bool) -> Result<String, DriverError> {
    let v = version_text
        .and_then(kernel_module_version)
        .ok_or(DriverError::NoVersion)?;
    if is_measured(&v) || force {
        Ok(v)
    } else {
        Err(DriverError::Untested(v))
    }
}

/// [`check_driver`] on the loaded driver, with the override from the environment.
pub fn check_loaded_driver() -> Result<String, DriverError> {
    check_driver(
        std::fs::read_to_string(VERSION_FILE).ok().as_deref(),
        forced(),
    )
}

/// Whether [`FORCE_VAR`] is set to 1.
pub fn forced() -> bool {
    std::env::var(FORCE_VAR).is_ok_and(|v| v == "1")
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

    #[test]
    fn only_measured_drivers_pass_unless_forced() {
        let v =
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build";
        assert_eq!(check_driver(Some(v), false).as_deref(), Ok("580.159.04"));
        let patch = v.replace("580.159.04", "580.159.11");
        assert_eq!(
            check_driver(Some(&patch), false).as_deref(),
            Ok("580.159.11")
        );
        let other = v.replace("580.159.04", "590.1.2");
        let why = check_driver(Some(&other), false).unwrap_err();
        assert_eq!(why, DriverError::Untested("590.1.2".into()));
        assert!(why.to_string().contains(FORCE_VAR), "{why}");
        assert_eq!(check_driver(Some(&other), true).as_deref(), Ok("590.1.2"));
        assert_eq!(check_driver(None, false), Err(DriverError::NoVersion));
        assert_eq!(
            check_driver(Some("garbage"), true),
            Err(DriverError::NoVersion)
        );
    }
}
