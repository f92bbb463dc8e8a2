//! The sysfs backend against fake `/sys/class/gpio` trees.
//!
//! A real kernel creates `gpioN/` when `N` is written to `export`; a plain
//! directory or tmpfs does not, so each test pre-creates `gpioN/direction`
//! and `gpioN/value` as the kernel would have them right after export, then
//! checks what the backend wrote to `export`, `direction` and `value`.
//!
//! Two flavours: a tempdir passed as the root, and — as root, as in CI — a
//! tmpfs mounted over the real `/sys/class/gpio` in a private mount
//! namespace, so the backend runs with its default root.

use std::fs;
use std::path::Path;

use baton_gpio::{
    Allowlist, BackendSpec, Gpio, GpioError, LineHandle, open_backend, parse_line_ref,
};

fn put(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).expect("mkdir");
    }
    fs::write(path, text).expect("write fixture");
}

fn get(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// A tree as the kernel shows it: `export`, one chip with base 32 and 16
/// lines, and lines 17 (low input), 18 (high input), 37 (= gpiochip32:5) and
/// 40 (already an output, high) "exported".
fn fake_tree(root: &Path) {
    put(&root.join("export"), "");
    put(&root.join("unexport"), "");
    put(&root.join("gpiochip32/base"), "32\n");
    put(&root.join("gpiochip32/ngpio"), "16\n");
    put(&root.join("gpiochip32/label"), "pinctrl\n");
    for (n, dir, val) in [(17, "in", 0), (18, "in", 1), (37, "in", 0), (40, "out", 1)] {
        put(
            &root.join(format!("gpio{n}/direction")),
            &format!("{dir}\n"),
        );
        put(&root.join(format!("gpio{n}/value")), &format!("{val}\n"));
    }
}

fn line(s: &str) -> baton_proto::pack::LineRef {
    parse_line_ref(s).expect("line ref")
}

fn open(root: &Path, allow: Allowlist) -> Box<dyn Gpio> {
    let spec = BackendSpec::Sysfs {
        root: root.to_owned(),
    };
    open_backend(&spec, allow).expect("open sysfs backend")
}

/// The checks both flavours run, on a tree already filled by `fake_tree`.
fn exercise(root: &Path, g: &mut dyn Gpio) -> Result<(), GpioError> {
    // Output request: exported, direction set glitch-free at the level the
    // line already had (low stays low, high stays high).
    let h17 = g.request(&line("17"))?;
    assert_eq!(get(&root.join("export")), "17");
    assert_eq!(get(&root.join("gpio17/direction")), "low");
    assert_eq!(g.level(h17), Some(0));
    let h18 = g.request(&line("18"))?;
    assert_eq!(get(&root.join("export")), "18");
    assert_eq!(get(&root.join("gpio18/direction")), "high");
    assert_eq!(g.level(h18), Some(1));

    // Writes go to the value file.
    g.write(h17, 1, 0, "e1")?;
    assert!(get(&root.join("gpio17/value")).starts_with('1'));
    assert_eq!(g.level(h17), Some(1));
    assert_eq!(g.read(h17)?, 1);
    g.write(h17, 0, 0, "e2")?;
    assert!(get(&root.join("gpio17/value")).starts_with('0'));

    // Idempotent: same handle, no second export.
    put(&root.join("export"), "");
    assert_eq!(g.request(&line("17"))?, h17);
    assert_eq!(get(&root.join("export")), "");

    // A line that already is an output keeps direction and level.
    let h40 = g.request(&line("40"))?;
    assert_eq!(get(&root.join("gpio40/direction")), "out\n");
    assert_eq!(g.level(h40), Some(1));

    // Chip-relative: gpiochip32 has base 32, so offset 5 is gpio37.
    let h37 = g.request(&line("gpiochip32:5"))?;
    assert_eq!(get(&root.join("export")), "37");
    assert_eq!(g.describe(h37), "gpiochip32:5 (gpio37)");
    assert_eq!(g.describe(h17), "gpio17");
    assert_eq!(g.request(&line("37"))?, h37, "same physical line");
    Ok(())
}

#[test]
fn tempdir_root() -> Result<(), GpioError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    fake_tree(root);
    let mut g = open(root, Allowlist::all());
    exercise(root, g.as_mut())
}

#[test]
fn value_file_is_opened_once() -> Result<(), GpioError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    fake_tree(root);
    let mut g = open(root, Allowlist::all());
    let h = g.request(&line("17"))?;
    // Swap the file under the backend: writes must still reach the
    // descriptor opened at request time (pwrite, no reopen per write).
    fs::rename(root.join("gpio17/value"), root.join("gpio17/value.orig")).expect("rename");
    put(&root.join("gpio17/value"), "0\n");
    g.write(h, 1, 0, "x")?;
    assert_eq!(get(&root.join("gpio17/value.orig")), "1\n");
    assert_eq!(get(&root.join("gpio17/value")), "0\n");
    Ok(())
}

#[test]
fn inputs_are_not_driven() -> Result<(), GpioError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    fake_tree(root);
    let mut g = open(root, Allowlist::all());
    let h = g.request_input(&line("18"))?;
    assert_eq!(get(&root.join("gpio18/direction")), "in\n", "untouched");
    assert_eq!(g.level(h), None);
    assert_eq!(g.read(h)?, 1);
    put(&root.join("gpio18/value"), "0\n");
    assert_eq!(g.read(h)?, 0, "reads sample the file each time");
    let e = g.write(h, 1, 0, "x").err().map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some("GPIO line gpio18 was requested as an input and cannot be driven")
    );
    // Requested as an output later: switched at its current level.
    assert_eq!(g.request(&line("18"))?, h);
    assert_eq!(get(&root.join("gpio18/direction")), "low");
    g.write(h, 1, 0, "x")?;
    // An output requested as input stays an output.
    assert_eq!(g.request_input(&line("18"))?, h);
    assert_eq!(g.level(h), Some(1));
    Ok(())
}

#[test]
fn errors_name_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();

    // No export file: no sysfs GPIO here.
    let e = open_backend(
        &BackendSpec::Sysfs {
            root: root.to_owned(),
        },
        Allowlist::all(),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("/export does not exist"), "{e}");

    fake_tree(root);
    let allow: Allowlist = "17, 18, 99, gpiochip32:5, gpiochip32:20, gpiochip9:1, NAMED"
        .parse()
        .expect("allowlist");
    let mut g = open(root, allow);
    let msg = |r: Result<LineHandle, GpioError>| r.err().map(|e| e.to_string()).unwrap_or_default();

    assert_eq!(
        msg(g.request(&line("19"))),
        "GPIO line 19 is not on the agent's allowlist (allowed: 17, 18, 99, gpiochip32:5, \
         gpiochip32:20, gpiochip9:1, NAMED)"
    );
    assert_eq!(
        get(&root.join("export")),
        "",
        "refused lines are not exported"
    );
    // Exported by the tree's "kernel"? No: gpio99 never appears.
    assert_eq!(
        msg(g.request(&line("99"))),
        format!(
            "no GPIO line gpio99: export succeeded but {} did not appear",
            root.join("gpio99").display()
        )
    );
    assert_eq!(
        msg(g.request(&line("gpiochip32:20"))),
        "no GPIO line gpiochip32:20: gpiochip32 has 16 lines (offsets 0..16)"
    );
    let e = msg(g.request(&line("gpiochip9:1")));
    assert!(e.starts_with("no GPIO chip gpiochip9: cannot read "), "{e}");
    assert!(e.contains("sysfs names chips by base number"), "{e}");
    assert_eq!(
        msg(g.request(&line("NAMED"))),
        "the sysfs GPIO backend cannot resolve line name \"NAMED\" (sysfs has no line names; \
         use an offset or the cdev backend)"
    );
    assert!(matches!(
        g.write(LineHandle(7), 1, 0, "x"),
        Err(GpioError::UnknownHandle(_))
    ));
}

/// What the issue asks for: a private mount namespace with tmpfs over
/// `/sys/class/gpio`, the backend on its default root. Needs root (CI runs
/// as root); skips with the reason otherwise.
#[test]
fn tmpfs_over_sys_class_gpio_in_a_private_mount_namespace() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        baton_testenv::missing(
            "tmpfs_over_sys_class_gpio",
            None,
            "needs root for unshare(CLONE_NEWNS) + mount",
        );
        return;
    }
    let outside_before = fs::read_dir("/sys/class/gpio").map(|d| d.count()).ok();
    // A dedicated thread: unshare(CLONE_NEWNS) applies to the calling thread
    // only (it unshares its fs context), so neither the test harness nor
    // other tests see the mount, and it vanishes when the thread ends.
    let verdict = std::thread::spawn(|| -> Result<(), String> {
        ns::enter_private_tmpfs_gpio()?;
        let root = Path::new("/sys/class/gpio");
        fake_tree(root);
        let mut g = open_backend(
            &"sysfs".parse().map_err(|e| format!("{e}"))?,
            Allowlist::all(),
        )
        .map_err(|e| e.to_string())?;
        exercise(root, g.as_mut()).map_err(|e| e.to_string())
    })
    .join();
    match verdict {
        Ok(Ok(())) => {}
        Ok(Err(skip)) if skip.starts_with("SKIP ") => {
            let why = skip.trim_start_matches("SKIP tmpfs_over_sys_class_gpio: ");
            baton_testenv::missing("tmpfs_over_sys_class_gpio", None, why);
        }
        Ok(Err(e)) => panic!("{e}"),
        Err(panic) => std::panic::resume_unwind(panic),
    }
    // Nothing leaked into this (the host's) namespace.
    let outside_after = fs::read_dir("/sys/class/gpio").map(|d| d.count()).ok();
    assert_eq!(outside_before, outside_after);
}

mod ns {
    use std::ffi::CString;
    use std::path::Path;

    fn cstr(s: &str) -> CString {
        CString::new(s).expect("no NUL")
    }

    fn mount(
        src: &str,
        target: &str,
        fstype: Option<&str>,
        flags: libc::c_ulong,
    ) -> Result<(), String> {
        let (src, target) = (cstr(src), cstr(target));
        let fstype = fstype.map(cstr);
        // SAFETY: valid C strings (or null) that outlive the call.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
                flags,
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(format!(
                "mount {target:?}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Private mount namespace for this thread with an empty tmpfs at
    /// `/sys/class/gpio`. `Err("SKIP ...")` when the sandbox forbids it.
    pub fn enter_private_tmpfs_gpio() -> Result<(), String> {
        // SAFETY: unshare takes flags only.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(format!(
                "SKIP tmpfs_over_sys_class_gpio: unshare(CLONE_NEWNS): {}",
                std::io::Error::last_os_error()
            ));
        }
        // Stop mount events propagating back to the host before mounting.
        mount("none", "/", None, libc::MS_REC | libc::MS_PRIVATE)?;
        if Path::new("/sys/class/gpio").is_dir() {
            mount("tmpfs", "/sys/class/gpio", Some("tmpfs"), 0)?;
        } else {
            // Kernel without CONFIG_GPIO_SYSFS (as on this CI machine): no
            // mount point, and sysfs allows no mkdir; cover /sys/class.
            mount("tmpfs", "/sys/class", Some("tmpfs"), 0)?;
            std::fs::create_dir("/sys/class/gpio").map_err(|e| format!("mkdir: {e}"))?;
        }
        Ok(())
    }
}
