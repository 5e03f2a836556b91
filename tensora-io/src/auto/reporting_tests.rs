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
    // The fill follows the fact: 2 MiB folios populated ahead where free memory stays the
    // guest's, 4 KiB read-ahead where the host is paid for its first touch.
    assert_eq!((on.backend, on.reading), ("sync", super::READ_AHEAD_COLD));
    assert_eq!((off.backend, off.reading), ("sync", super::POPULATE_AHEAD_COLD));
    assert!(on.reason.contains("read ahead of the copies in 4 KiB folios"), "{}", on.reason);
    assert!(off.reason.contains("populated ahead of the copies in 2 MiB folios"), "{}", off.reason);
    // A tensor-parallel share's reads leave gaps that 2 MiB folios would fill with other ranks'
    // rows: slices keep the 4 KiB read-ahead, and the reason says why.
    f.pieces = super::Pieces::Slices;
    let slices = super::choose(&f);
    assert_eq!(slices.reading, super::READ_AHEAD_COLD, "{}", slices.reason);
    assert!(slices.reason.contains("in 4 KiB folios, slices (free memory not reported"), "{}", slices.reason);
}
