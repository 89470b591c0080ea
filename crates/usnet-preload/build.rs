//! Compiles `src/execl.c` (the variadic `execl`, `execlp` and `execle`, which Rust
//! stable cannot define) into the shim.
fn main() {
    println!("cargo:rerun-if-changed=src/execl.c");
    cc::Build::new()
        .file("src/execl.c")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .compile("usnet_preload_execl");
}
