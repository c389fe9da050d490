#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz_bodies::fleet_toml(data));
