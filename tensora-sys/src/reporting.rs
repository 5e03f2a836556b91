//! Whether this machine hands its free memory back to a hypervisor ("free page reporting"): a
//! fact `tensora_io`'s `auto` reads for the cold load that keeps its pages.
//!
//! A VM whose balloon device reports free blocks (`VIRTIO_BALLOON_F_REPORTING`) tells its host
//! about every free block of at least `2^page_reporting_order` pages, and the host discards them;
//! the next first touch of such a block costs host-side (and EPT) faults. A 2 MiB folio or a 2 MiB
//! anonymous huge page is allocated from exactly such a block, so on a reporting VM the first
//! touch of large folios is slow and erratic, while 4 KiB folios mostly come from per-CPU lists
//! that were never reported. Measured on this VM (docs/performance.md "Restarts", reporting as
//! it is against held off): the first touch of 2.2 GB of fresh `MADV_HUGEPAGE` memory 0.24-0.29 s
//! with reporting held off, 2.8-4.0 s with it; the first copy out of freshly filled 2 MiB page
//! cache folios 0.19-0.32 s against 3.0-6.2 s. So a cold fill in 2 MiB folios (0.97x the device
//! here, the 4 KiB fill 0.74x) is only worth it where free memory is not reported.
//!
//! [`read_free_reporting`] reads, under a sysfs root, at most `BALLOON_DEVICES_MAX` balloon
//! devices' `features` and two of `page_reporting`'s parameters, each a small file read up to a
//! bound (`memory.rs`'s); absent files mean "not reported".

use std::path::Path;

use crate::memory::read_small;

/// Where Linux's free page reporting keeps its parameters, under the sysfs root.
const REPORTING_PARAMETERS_DIR: &str = "module/page_reporting/parameters";
/// Where the bound virtio balloon devices are listed, under the sysfs root.
const VIRTIO_BALLOON_DRIVER_DIR: &str = "bus/virtio/drivers/virtio_balloon";
/// `VIRTIO_BALLOON_F_REPORTING`: the feature bit of a balloon device that reports free pages.
const VIRTIO_BALLOON_F_REPORTING_BIT: usize = 5;
/// The delay between a free and its report on a kernel without a `min_free_ms` parameter
/// (Linux's `PAGE_REPORTING_DELAY`, 2 s).
const UPSTREAM_REPORT_DELAY_MS: u64 = 2000;
/// The largest buddy order of a 4 KiB-page kernel (`MAX_PAGE_ORDER`): a reporting order above it
/// reports no block at all.
const BUDDY_ORDER_MAX: u32 = 10;
/// Balloon devices looked at, at most.
const BALLOON_DEVICES_MAX: usize = 16;

/// Whether free memory is reported to a hypervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FreeReporting {
    /// Free memory stays the guest's: no bound balloon device reports it, or the reporting order
    /// is above every buddy order. The reason names which.
    Off(String),
    /// Free blocks of `2^order` pages and more are reported once free for `after_ms`.
    On {
        /// `page_reporting_order`.
        order: u32,
        /// `min_free_ms`, or Linux's 2 s (`PAGE_REPORTING_DELAY`) where the kernel has no such knob.
        after_ms: u64,
    },
}

impl FreeReporting {
    /// One clause for a load report's reason.
    pub fn describe(&self) -> String {
        match self {
            FreeReporting::Off(why) => format!("free memory not reported to a hypervisor ({why})"),
            FreeReporting::On { order, after_ms } => format!(
                "free memory reported to the hypervisor (blocks of {} KiB and more, after {after_ms} ms)",
                4u64 << order
            ),
        }
    }
}

/// The fact on this machine (`/sys`).
pub fn free_reporting() -> FreeReporting {
    read_free_reporting(Path::new("/sys"))
}

/// The fact read under `sysfs_root` (see the module docs).
pub fn read_free_reporting(sysfs_root: &Path) -> FreeReporting {
    let parameters = sysfs_root.join(REPORTING_PARAMETERS_DIR);
    let read = |name: &str| read_small(&parameters.join(name));
    decide(
        balloon_reports(&sysfs_root.join(VIRTIO_BALLOON_DRIVER_DIR)),
        read("page_reporting_order").as_deref(),
        read("min_free_ms").as_deref(),
    )
}

/// The rule over what was read: a reporting device, the order, the delay (text of the files).
fn decide(device_reports: bool, order: Option<&str>, min_free_ms: Option<&str>) -> FreeReporting {
    if !device_reports {
        return FreeReporting::Off("no balloon device with free page reporting".to_owned());
    }
    let Some(order) = order.and_then(|o| o.trim().parse::<u32>().ok()) else {
        return FreeReporting::Off("no page_reporting_order".to_owned());
    };
    if order > BUDDY_ORDER_MAX {
        return FreeReporting::Off(format!("page_reporting_order {order} above every buddy order"));
    }
    let after_ms = min_free_ms.and_then(|m| m.trim().parse().ok()).unwrap_or(UPSTREAM_REPORT_DELAY_MS);
    FreeReporting::On { order, after_ms }
}

/// Whether a device bound to the balloon driver under `driver_dir` offers free page reporting
/// (its `features` string, one `0`/`1` per bit from bit 0).
fn balloon_reports(driver_dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(driver_dir) else {
        return false;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("virtio"))
        .take(BALLOON_DEVICES_MAX)
        .filter_map(|e| read_small(&e.path().join("features")))
        .any(|bits| bits.trim().as_bytes().get(VIRTIO_BALLOON_F_REPORTING_BIT) == Some(&b'1'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs-shaped tree: a balloon device with `features`, and the reporting parameters given.
    fn sysfs(features: Option<&str>, params: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        if let Some(bits) = features {
            let dev = root.path().join(VIRTIO_BALLOON_DRIVER_DIR).join("virtio0");
            std::fs::create_dir_all(&dev).unwrap();
            std::fs::write(dev.join("features"), format!("{bits}\n")).unwrap();
        }
        let dir = root.path().join(REPORTING_PARAMETERS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in params {
            std::fs::write(dir.join(name), format!("{value}\n")).unwrap();
        }
        root
    }

    /// This VM's balloon: bits 1, 2, 5 and 7 (stats, deflate on OOM, reporting, and one more).
    const REPORTING_FEATURES: &str = "0110010100000000000000000000000010000000";

    #[test]
    fn a_reporting_balloon_with_its_parameters_reports_with_their_order_and_delay() {
        let root = sysfs(Some(REPORTING_FEATURES), &[("page_reporting_order", "9"), ("min_free_ms", "0")]);
        let r = read_free_reporting(root.path());
        assert_eq!(r, FreeReporting::On { order: 9, after_ms: 0 });
        assert_eq!(
            r.describe(),
            "free memory reported to the hypervisor (blocks of 2048 KiB and more, after 0 ms)"
        );
        // A kernel without the `min_free_ms` knob reports 2 s after a free.
        let root = sysfs(Some(REPORTING_FEATURES), &[("page_reporting_order", "9")]);
        assert_eq!(read_free_reporting(root.path()), FreeReporting::On { order: 9, after_ms: 2000 });
    }

    #[test]
    fn no_device_no_reporting_bit_no_order_or_an_order_above_the_buddy_orders_is_not_reported() {
        let params = [("page_reporting_order", "9"), ("min_free_ms", "0")];
        // The parameters exist wherever the kernel has the code; without a device nothing reports.
        let none = read_free_reporting(sysfs(None, &params).path());
        assert_eq!(none, FreeReporting::Off("no balloon device with free page reporting".to_owned()));
        // A balloon without bit 5 (stats and deflate on OOM only).
        let r = read_free_reporting(sysfs(Some("0110000000"), &params).path());
        assert!(matches!(r, FreeReporting::Off(_)), "{r:?}");
        let r = read_free_reporting(sysfs(Some(REPORTING_FEATURES), &[]).path());
        assert_eq!(r, FreeReporting::Off("no page_reporting_order".to_owned()));
        // The hold-off used for the measurements: order 11 reports no block.
        let r =
            read_free_reporting(sysfs(Some(REPORTING_FEATURES), &[("page_reporting_order", "11")]).path());
        assert_eq!(r, FreeReporting::Off("page_reporting_order 11 above every buddy order".to_owned()));
        // The highest order that still reports.
        let r =
            read_free_reporting(sysfs(Some(REPORTING_FEATURES), &[("page_reporting_order", "10")]).path());
        assert_eq!(r, FreeReporting::On { order: 10, after_ms: 2000 });
        // Nothing there at all (not Linux, or no sysfs).
        assert!(matches!(read_free_reporting(Path::new("/nonexistent-sysfs")), FreeReporting::Off(_)));
    }
}
