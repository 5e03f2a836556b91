//! `auto`'s rules on facts made up for each side of them.

use super::*;
use proptest::prelude::*;

/// The promise, for pure rule tests that map nothing.
fn p() -> FilesUnchanged {
    // SAFETY: `choose` maps nothing; no view is ever made from these facts.
    unsafe { FilesUnchanged::promise() }
}

pub(super) fn facts() -> Facts {
    Facts {
        bytes_selected: 2 << 30,
        bytes_files: 2 << 30,
        files: 2,
        file_len_max_bytes: 1 << 30,
        residency: ResidencySample { sampled_pages: 100, resident_pages: 100 },
        filesystem: Some(probe::classify_filesystem(0xEF53)),
        uring: Ok(()),
        direct: None,
        cpus: 2,
        delivery: Delivery::Owned,
        residence: Residence::Owned,
        io_mode: IoMode::Auto,
        owned_destination_bytes: 2 << 30,
        memory: Some(MemoryRoom {
            total_bytes: 24 << 30,
            available_bytes: 20 << 30,
            cgroup_limit_bytes: None,
        }),
        free_reporting: memory::FreeReporting::On { order: 9, after_ms: 0 },
        pieces: Pieces::WholeTensors,
    }
}

/// Facts of a cold load that does not fit in the page cache (so it reads around it).
pub(super) fn cold_around() -> Facts {
    let mut f = facts();
    f.residency.resident_pages = 0;
    f.memory = Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: 4 << 30, cgroup_limit_bytes: None });
    f
}

#[test]
fn warm_picks_sync_buffered_and_names_the_facts() {
    let c = choose(&facts());
    assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "sync", false));
    assert!(c.reason.contains("warm") && c.reason.contains("100% of sampled pages cached"), "{}", c.reason);
    assert!(c.reason.contains("ext4") && c.reason.contains("2 file(s)"), "{}", c.reason);
    assert!(!c.reason.contains('\n'));
}

/// Only a load of cold data through the page cache reads ahead of its copies: a warm one
/// copies (or maps) what is cached, either side of `WARM_FRACTION`, owned and mapped.
#[test]
fn only_cold_reads_through_the_cache_read_ahead() {
    let warm_pages = (WARM_FRACTION * 100.0) as u64;
    for residence in [Residence::Owned, Residence::Auto(p()), Residence::Mapped(p())] {
        let mut f = Facts { residence, ..facts() };
        f.residency.resident_pages = warm_pages;
        let c = choose(&f);
        assert_eq!(c.reading, Reading::Cached, "{}", c.reason);
        f.residency.resident_pages = warm_pages - 1;
        let c = choose(&f);
        assert_eq!(c.reading, READ_AHEAD_COLD, "{}", c.reason);
        assert!(c.reason.contains("cold") || c.reason.contains("mapped"), "{}", c.reason);
    }
    // Cold and around the page cache: the direct queue, no read-ahead.
    let mut f = cold_around();
    f.direct = Some(Ok(()));
    assert_eq!(choose(&f).reading, Reading::Direct);
    // A network filesystem reads buffered: ahead when cold, not when warm.
    f.filesystem = Some(probe::classify_filesystem(0x6969));
    assert_eq!(choose(&f).reading, READ_AHEAD_COLD);
    f.residency.resident_pages = 100;
    assert_eq!(choose(&f).reading, Reading::Cached);
}

#[test]
fn a_cast_converts_from_views_only_when_warm_on_a_local_filesystem() {
    let warm_pages = (WARM_FRACTION * 100.0) as u64;
    let mut f = facts();
    f.residency.resident_pages = warm_pages;
    assert!(cast_from_views(&f).is_some());
    f.residency.resident_pages = warm_pages - 1;
    assert_eq!(cast_from_views(&f), None);
    f.residency.resident_pages = warm_pages;
    f.filesystem = Some(probe::classify_filesystem(0x6969));
    assert_eq!(cast_from_views(&f), None, "NFS");
    f.filesystem = None;
    assert_eq!(cast_from_views(&f), None, "filesystem unknown");
}

#[test]
fn cold_large_with_direct_and_uring_picks_uring_direct() {
    let mut f = cold_around();
    f.direct = Some(Ok(()));
    let c = choose(&f);
    assert_eq!((c.backend, c.reading.is_direct()), ("io-uring", true));
    assert!(c.reason.contains("cold, around the page cache"), "{}", c.reason);
    f.uring = Err("EPERM".into());
    let c = choose(&f);
    assert_eq!((c.backend, c.reading.is_direct()), ("sync", false));
    assert!(c.reason.contains("no io_uring (EPERM)"), "{}", c.reason);
    f.uring = Ok(());
    f.bytes_selected = 1 << 20;
    assert_eq!(choose(&f).backend, "sync");
    f.bytes_selected = 2 << 30;
    f.direct = Some(Err("EINVAL".into()));
    assert!(choose(&f).reason.contains("no O_DIRECT"));
}

#[test]
fn remote_filesystems_never_get_lazy_views_or_direct() {
    let mut f = facts();
    f.filesystem = Some(probe::classify_filesystem(0x6969));
    f.residency.resident_pages = 0;
    f.direct = Some(Ok(()));
    let c = choose(&f);
    assert_eq!((c.backend, c.reading.is_direct()), ("sync", false));
    assert!(c.reason.contains("nfs"));
    f.residence = Residence::Auto(p());
    f.residency.resident_pages = 100;
    let c = choose(&f);
    assert_eq!((c.residence, c.backend), (Residence::Owned, "sync"));
    assert!(c.reason.starts_with("owned: nfs is a network/FUSE filesystem"), "{}", c.reason);
    f.residence = Residence::Mapped(p());
    let c = choose(&f);
    assert_eq!(c.residence, Residence::Mapped(p()));
    assert!(c.reason.contains("note: nfs") && c.reason.contains("read in at load"), "{}", c.reason);
    assert!(c.reason.starts_with("mapped: residence \"mapped\""), "{}", c.reason);
}

#[test]
fn auto_residence_maps_warm_local_data_and_owns_cold_data() {
    let mut f = Facts { residence: Residence::Auto(p()), ..facts() };
    let c = choose(&f);
    assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Mapped(p()), "mmap", false));
    assert!(c.reason.starts_with("mapped: warm, on local ext4"), "{}", c.reason);
    f.memory = cold_around().memory;
    f.residency.resident_pages = 49;
    f.direct = Some(Ok(()));
    let c = choose(&f);
    assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "io-uring", true));
    assert!(c.reason.starts_with("owned: cold, around the page cache ("), "{}", c.reason);
    assert!(c.reason.contains("; cold, around the page cache, O_DIRECT"), "{}", c.reason);
    f.residency = ResidencySample::default();
    assert!(choose(&f).reason.starts_with("owned: no page-cache sample"));
}

#[test]
fn mapped_residence_picks_mmap_and_density_is_sane() {
    let mut f = facts();
    f.residence = Residence::Mapped(p());
    assert_eq!(choose(&f).backend, "mmap");
    f.bytes_selected = 1 << 30;
    assert!((f.density() - 0.5).abs() < 1e-9);
    f.bytes_files = 0;
    assert_eq!(f.density(), 1.0);
    f.residency = ResidencySample::default();
    assert!(!f.warm());
}

#[test]
fn a_cold_load_that_fits_keeps_its_pages_when_views_are_allowed_and_says_so() {
    let mut f = Facts { residence: Residence::Auto(p()), ..facts() };
    f.residency.resident_pages = 0;
    f.direct = Some(Ok(()));
    // 2 GiB to cache + 3 GiB margin (24 GiB / 8) <= 20 GiB: mapped, pages kept.
    let c = choose(&f);
    assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Mapped(p()), "mmap", false));
    assert!(c.reason.contains("pages kept cached for the next load (2.15 GB to cache"), "{}", c.reason);
    assert!(c.reason.contains("<= 21.47 GB available"), "{}", c.reason);
    // Asked for O_DIRECT: around the cache, whatever the room.
    f.io_mode = IoMode::Direct;
    let c = choose(&f);
    assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "io-uring", true));
    assert!(c.reason.starts_with("owned: cold, around the page cache (O_DIRECT asked)"), "{}", c.reason);
    // Filesystem unknown: never cold views.
    f.io_mode = IoMode::Auto;
    f.filesystem = None;
    let c = choose(&f);
    assert_eq!(c.residence, Residence::Owned, "{}", c.reason);
    assert!(c.reason.starts_with("owned: cold, on a filesystem statfs could not name"), "{}", c.reason);
    f.filesystem = facts().filesystem;
    // Room unknown: around the cache.
    f.memory = None;
    assert!(page_cache(&f, 0) == PageCache::Around("available memory unknown".to_owned()));
    assert_eq!(choose(&f).backend, "io-uring");
    // An owned copy whose pages and arena fit keeps the pages too: buffered, read ahead.
    f.memory = facts().memory;
    f.residence = Residence::Owned;
    let c = choose(&f);
    assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "sync", false));
    assert!(
        c.reason.starts_with(
            "owned: residence \"owned\"; cold, pages kept cached for the next load (2.15 GB to cache + \
             2.15 GB destination"
        ),
        "{}",
        c.reason
    );
    assert!(c.reason.contains("buffered pread, the files read ahead of the copies"), "{}", c.reason);
}

#[test]
fn an_owned_cold_copy_keeps_its_pages_exactly_when_pages_and_arena_fit() {
    let mut f = cold_around();
    f.direct = Some(Ok(()));
    // 2 GiB of pages + 2 GiB of arena + 3 GiB of margin (24 GiB / 8): 7 GiB needed.
    let need_bytes = 7u64 << 30;
    f.memory =
        Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: need_bytes, cgroup_limit_bytes: None });
    let c = choose(&f);
    assert_eq!((c.backend, c.reading.is_direct()), ("sync", false), "{}", c.reason);
    assert!(c.reason.contains("<= 7.52 GB available"), "{}", c.reason);
    f.memory =
        Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: need_bytes - 1, cgroup_limit_bytes: None });
    let c = choose(&f);
    assert_eq!((c.backend, c.reading.is_direct()), ("io-uring", true), "{}", c.reason);
    assert!(
        c.reason.starts_with("owned: residence \"owned\"; cold, around the page cache, O_DIRECT"),
        "{}",
        c.reason
    );
    // --direct / cache_pages=False: around the cache however much room there is.
    f.memory = facts().memory;
    f.io_mode = IoMode::Direct;
    assert_eq!(choose(&f).backend, "io-uring");
    // Without O_DIRECT or io_uring a cold copy that fits still says it keeps its pages.
    f.io_mode = IoMode::Auto;
    f.direct = Some(Err("EINVAL".into()));
    assert!(choose(&f).reason.contains("cold, pages kept cached"));
}

#[test]
fn auto_residence_maps_a_cold_load_whose_pages_fit_but_not_its_arena() {
    // 2 GiB to cache + 3 GiB margin fits in 6 GiB; with the 2 GiB arena it would not.
    let mut f = Facts { residence: Residence::Auto(p()), ..facts() };
    f.residency.resident_pages = 0;
    f.direct = Some(Ok(()));
    f.memory = Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: 6 << 30, cgroup_limit_bytes: None });
    let c = choose(&f);
    assert_eq!((c.residence, c.backend), (Residence::Mapped(p()), "mmap"));
    assert!(c.reason.starts_with("mapped: cold, on local ext4, pages kept cached"), "{}", c.reason);
    f.residence = Residence::Owned;
    let c = choose(&f);
    assert_eq!((c.backend, c.reading.is_direct()), ("io-uring", true), "{}", c.reason);
    // A streamed load's destination is one window: it fits again.
    f.delivery = Delivery::Streaming;
    f.owned_destination_bytes = 256 << 20;
    assert!(matches!(page_cache(&f, f.owned_destination_bytes), PageCache::Keep(_)));
    // A cgroup's limit is named when it is what binds.
    f.memory = Some(MemoryRoom {
        total_bytes: 24 << 30,
        available_bytes: 1 << 30,
        cgroup_limit_bytes: Some(2 << 30),
    });
    let PageCache::Around(why) = page_cache(&f, 0) else { panic!("1 GiB of room cannot hold 2 GiB") };
    assert!(why.ends_with("1.07 GB available (cgroup limit)"), "{why}");
}

#[test]
fn a_view_opened_cold_is_read_ahead_exactly_when_local_and_its_pages_fit() {
    let mut f = cold_around();
    // 2 GiB of pages + 3 GiB of margin: 5 GiB needed, no destination for views.
    f.memory = Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: 5 << 30, cgroup_limit_bytes: None });
    let why = read_ahead_at_open(&f).unwrap();
    assert!(why.starts_with("cold, pages fit (2.15 GB to cache + 0.00 GB destination"), "{why}");
    f.memory =
        Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: (5 << 30) - 1, cgroup_limit_bytes: None });
    assert!(read_ahead_at_open(&f).unwrap_err().starts_with("cold, pages do not fit"));
    f.memory = facts().memory;
    f.io_mode = IoMode::Direct;
    assert!(read_ahead_at_open(&f).is_err(), "O_DIRECT asked: nothing kept");
    f.io_mode = IoMode::Auto;
    f.residency.resident_pages = 50;
    assert_eq!(read_ahead_at_open(&f).unwrap_err(), "warm (50% of sampled pages cached)");
    f.residency.resident_pages = 0;
    f.filesystem = Some(probe::classify_filesystem(0x6969));
    assert!(read_ahead_at_open(&f).unwrap_err().contains("network/FUSE"));
    f.filesystem = None;
    assert!(read_ahead_at_open(&f).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// The page-cache rule is exactly the stated sum, on both sides of the threshold, and a
    /// load kept in the cache never reads with O_DIRECT.
    #[test]
    fn pages_are_kept_exactly_when_the_sum_fits(
        selected_mib in 1u64..40_000,
        available_mib in 0u64..30_000,
        resident in 0u64..=100,
        destination_mib in 0u64..40_000,
    ) {
        let mut f = facts();
        f.bytes_selected = selected_mib << 20;
        f.residency.resident_pages = resident;
        f.memory = Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: available_mib << 20, cgroup_limit_bytes: None });
        let uncached = (f.bytes_selected as f64 * (1.0 - resident as f64 / 100.0)) as u64;
        let margin = PAGE_CACHE_MARGIN_MIN_BYTES.max((24u64 << 30) / PAGE_CACHE_MARGIN_DIVISOR);
        let fits = uncached + (destination_mib << 20) + margin <= available_mib << 20;
        let kept = matches!(page_cache(&f, destination_mib << 20), PageCache::Keep(_));
        prop_assert_eq!(kept, fits);
        f.residence = Residence::Auto(p());
        f.direct = Some(Ok(()));
        let c = choose(&f);
        // Views need no destination: they keep the pages when the pages alone fit.
        let views_fit = matches!(page_cache(&f, 0), PageCache::Keep(_));
        prop_assert_eq!(c.residence == Residence::Mapped(p()), views_fit || resident >= 50, "{}", c.reason);
        prop_assert!(!(views_fit && c.reading.is_direct()), "{}", c.reason);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Mapped exactly when asked for, or when asked to decide on local data that is warm or
    /// whose pages fit in the page cache; the reason starts with the residence whenever `auto`
    /// decided it.
    #[test]
    fn mapped_only_when_asked_or_local_and_warm_or_fitting(
        resident in proptest::option::of(0u64..=100),
        remote in any::<bool>(),
        residence in prop_oneof![Just(Residence::Auto(p())), Just(Residence::Owned), Just(Residence::Mapped(p()))],
        available_gib in 0u64..24,
    ) {
        let f = Facts {
            residency: resident.map_or(ResidencySample::default(), |r| ResidencySample {
                sampled_pages: 100,
                resident_pages: r,
            }),
            filesystem: Some(probe::classify_filesystem(if remote { 0x6969 } else { 0xEF53 })),
            residence,
            memory: Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: available_gib << 30, cgroup_limit_bytes: None }),
            ..facts()
        };
        let c = choose(&f);
        let warm = resident.is_some_and(|r| r as f64 / 100.0 >= WARM_FRACTION);
        // 2 GiB selected, the part not resident to cache, a 3 GiB margin (24 GiB / 8).
        let fits = resident.is_some_and(|r| {
            ((2u64 << 30) as f64 * (1.0 - r as f64 / 100.0)) as u64 + (3 << 30) <= available_gib << 30
        });
        let want_mapped = match residence {
            Residence::Mapped(_) => true,
            Residence::Owned => false,
            Residence::Auto(_) => !remote && (warm || fits),
        };
        prop_assert_eq!(c.residence == Residence::Mapped(p()), want_mapped);
        prop_assert_eq!(c.backend == "mmap", want_mapped);
        prop_assert!(!(want_mapped && c.reading.is_direct()));
        let prefix = if want_mapped { "mapped:" } else { "owned:" };
        prop_assert!(c.reason.starts_with(prefix), "{}", c.reason);
    }
}
