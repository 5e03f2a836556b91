//! `auto`'s cold keep and the free-page-reporting fact (`tensora_sys::free_reporting`).

#[test]
fn a_cold_owned_keep_names_whether_free_memory_is_reported_on_both_sides() {
    // A cold owned copy whose pages and arena fit (the `auto` cold keep).
    let mut f = super::tests::cold_around();
    f.memory = super::tests::facts().memory;
    let on = super::choose(&f);
    assert!(
        on.reason.contains(
            "4 KiB folios (free memory reported to the hypervisor (blocks of 2048 KiB and more, after 0 ms))"
        ),
        "{}",
        on.reason
    );
    f.free_reporting =
        super::memory::FreeReporting::Off("no balloon device with free page reporting".to_owned());
    let off = super::choose(&f);
    assert!(
        off.reason.contains("(free memory not reported to a hypervisor (no balloon device"),
        "{}",
        off.reason
    );
    // The fact is named; the placement does not change with it yet (the sync backend has no
    // large-folio fill: docs/performance.md "Restarts").
    assert_eq!((on.backend, on.reading), (off.backend, off.reading));
}
