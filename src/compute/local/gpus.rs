//! The machine's NVIDIA GPUs as `gantry serve` finds them, and which job holds which.
//!
//! At start the runner reads the driver's own files: the device files `nvidia<N>` in the device
//! folder (`/dev`) and, for each GPU, `gpus/<bus>/information` in the driver's folder
//! (`/proc/driver/nvidia`: its model, device minor number and UUID). `nvidia-smi` is not run.
//! Both folders are settings, so tests point them at stand-in files. A job of a GPU function
//! takes as many GPUs as its size's profile names (one by default), of the profile's model when
//! it names one, none held by another job; its confinement then admits, read-write, exactly the
//! device files those GPUs need (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, its own
//! `nvidia<N>`) and, read-only, what CUDA reads of the driver (`/proc/driver/nvidia`, `/sys`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::domain::sizes::gpu_model_matches as model_matches;

/// Where `serve` looks for GPUs and which it lends to jobs.
#[derive(Debug, Clone, clap::Args)]
pub struct GpuArgs {
    /// Folder of the NVIDIA driver's device files (`nvidiactl`, `nvidia-uvm`, `nvidia<N>`).
    #[arg(long = "gpu-device-dir", env = "GANTRY_GPU_DEVICE_DIR", default_value = "/dev")]
    pub device_dir: PathBuf,
    /// The NVIDIA driver's information folder (`gpus/<bus>/information`: model, minor, UUID).
    #[arg(long = "gpu-driver-dir", env = "GANTRY_GPU_DRIVER_DIR", default_value = "/proc/driver/nvidia")]
    pub driver_dir: PathBuf,
    /// Which of the GPUs found jobs may use: `all`, `none`, or device numbers (`0,2`).
    #[arg(long = "gpus", env = "GANTRY_GPUS", default_value = "all")]
    pub gpus: String,
}

impl Default for GpuArgs {
    fn default() -> Self {
        GpuArgs { device_dir: "/dev".into(), driver_dir: "/proc/driver/nvidia".into(), gpus: "all".into() }
    }
}

/// The device files every job with a GPU opens, besides its GPUs' own.
pub const SHARED_DEVICES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// What CUDA reads of the driver and the machine, read-only, in a GPU job (`/proc/devices`:
/// the driver's major numbers, which CUDA looks up for `nvidia-uvm`).
pub const DRIVER_READ: [&str; 3] = ["/proc/driver/nvidia", "/sys", "/proc/devices"];

/// One GPU of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its device file's number (`nvidia<minor>`).
    pub minor: u32,
    /// The driver's name of its model (`NVIDIA H200`), or `unknown`.
    pub model: String,
    /// `GPU-…`, when the driver says it.
    pub uuid: Option<String>,
}

/// The machine's GPUs and which job holds each.
#[derive(Debug)]
pub struct GpuPool {
    device_dir: PathBuf,
    driver_dir: PathBuf,
    gpus: Vec<Gpu>,
    /// Holder of each GPU, by index in `gpus`.
    held: Mutex<Vec<Option<String>>>,
    /// How they were found, for the start-up report.
    found_by: String,
}

impl GpuArgs {
    /// Finds the GPUs jobs may use. Err: `--gpus` names a GPU this machine does not have.
    pub fn pool(&self) -> Result<GpuPool, String> {
        let found = discover(&self.device_dir, &self.driver_dir);
        let chosen: Vec<Gpu> = match self.gpus.trim() {
            "all" | "" => found,
            "none" => Vec::new(),
            list => {
                let mut chosen = Vec::new();
                for part in list.split(',').map(str::trim) {
                    let minor: u32 = part
                        .parse()
                        .map_err(|_| format!("--gpus: '{part}' is not a device number (give all, none or 0,1,...)"))?;
                    let gpu = found.iter().find(|gpu| gpu.minor == minor).ok_or_else(|| {
                        format!("--gpus: this machine has no GPU {minor} ({}/nvidia{minor})", self.device_dir.display())
                    })?;
                    chosen.push(gpu.clone());
                }
                chosen
            }
        };
        let found_by = format!(
            "the driver's device files ({}/nvidia<N>) and {}/gpus/*/information",
            self.device_dir.display(),
            self.driver_dir.display()
        );
        Ok(GpuPool::new(self.device_dir.clone(), self.driver_dir.clone(), chosen, found_by))
    }
}

/// The GPUs whose device file `nvidia<N>` is in `device_dir`, with what the driver's
/// `information` files in `driver_dir` say of each (by device minor number).
pub fn discover(device_dir: &Path, driver_dir: &Path) -> Vec<Gpu> {
    let mut described: HashMap<u32, (String, Option<String>)> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir(driver_dir.join("gpus")) {
        for entry in entries.flatten() {
            if let Ok(text) = std::fs::read_to_string(entry.path().join("information"))
                && let Some((minor, model, uuid)) = parse_information(&text)
            {
                described.insert(minor, (model, uuid));
            }
        }
    }
    let mut gpus: Vec<Gpu> = std::fs::read_dir(device_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.strip_prefix("nvidia")?.parse::<u32>().ok())
        .map(|minor| {
            let (model, uuid) = described.get(&minor).cloned().unwrap_or_else(|| ("unknown".into(), None));
            Gpu { minor, model, uuid }
        })
        .collect();
    gpus.sort_by_key(|gpu| gpu.minor);
    gpus
}

/// Device minor number, model and UUID from a driver's `information` file
/// (`Model:          NVIDIA H200` / `Device Minor:   0` / `GPU UUID:       GPU-…`).
pub fn parse_information(text: &str) -> Option<(u32, String, Option<String>)> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let minor = field("Device Minor")?.parse().ok()?;
    let model = field("Model").filter(|m| !m.is_empty()).unwrap_or_else(|| "unknown".into());
    let uuid = field("GPU UUID").filter(|u| u.starts_with("GPU-"));
    Some((minor, model, uuid))
}

/// The GPUs a job holds: what its confinement and environment get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub gpus: Vec<Gpu>,
    /// Device files the job may open read-write.
    pub devices: Vec<PathBuf>,
    /// Driver files and folders it may read.
    pub readable: Vec<PathBuf>,
}

impl Held {
    /// `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`: the GPUs' UUIDs where the driver
    /// gives them (CUDA's own numbering need not follow the device files'), else their numbers
    /// in PCI bus order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    pub fn environment(&self) -> Vec<(String, String)> {
        let by_uuid = self.gpus.iter().all(|gpu| gpu.uuid.is_some());
        let names: Vec<String> = self
            .gpus
            .iter()
            .map(|gpu| match (&gpu.uuid, by_uuid) {
                (Some(uuid), true) => uuid.clone(),
                _ => gpu.minor.to_string(),
            })
            .collect();
        let list = names.join(",");
        let mut env = vec![("CUDA_VISIBLE_DEVICES".to_string(), list.clone()), ("NVIDIA_VISIBLE_DEVICES".into(), list)];
        if !by_uuid {
            env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
        }
        env
    }
}

impl GpuPool {
    pub fn new(device_dir: PathBuf, driver_dir: PathBuf, gpus: Vec<Gpu>, found_by: String) -> GpuPool {
        let held = Mutex::new(vec![None; gpus.len()]);
        GpuPool { device_dir, driver_dir, gpus, held, found_by }
    }

    /// A pool without GPUs.
    pub fn empty() -> GpuPool {
        GpuPool::new(PathBuf::new(), PathBuf::new(), Vec::new(), "nothing (no GPU lent to jobs)".into())
    }

    pub fn count(&self) -> usize {
        self.gpus.len()
    }

    /// One line for the start-up report.
    pub fn describe(&self) -> String {
        if self.gpus.is_empty() {
            return format!("GPUs: none found (looked at {}): GPU functions cannot run here", self.found_by);
        }
        let list: Vec<String> = self.gpus.iter().map(|gpu| format!("nvidia{} {}", gpu.minor, gpu.model)).collect();
        format!("GPUs: {} found from {}: {}", self.gpus.len(), self.found_by, list.join(", "))
    }

    /// Whether a job asking for `count` GPUs of `model` (any model: `None`) can ever run here;
    /// Err says why not, in the words of `run`'s refusal.
    pub fn check(&self, count: u32, model: Option<&str>) -> Result<(), String> {
        let fitting = self.gpus.iter().filter(|gpu| model.is_none_or(|m| model_matches(&gpu.model, m))).count();
        if fitting >= count as usize {
            return Ok(());
        }
        let have = if self.gpus.is_empty() {
            "this machine has no GPU".to_string()
        } else {
            let models: Vec<&str> = self.gpus.iter().map(|gpu| gpu.model.as_str()).collect();
            format!("this machine has {} ({})", self.gpus.len(), models.join(", "))
        };
        Err(match model {
            Some(model) => format!("it asks for {count} GPU(s) of model '{model}' and {have}"),
            None => format!("it asks for {count} GPU(s) and {have}"),
        })
    }

    /// The models of the GPUs no job holds (what admission may still lend).
    pub fn free_models(&self) -> Vec<String> {
        let held = self.held.lock().expect("lock");
        self.gpus
            .iter()
            .zip(held.iter())
            .filter(|(_, holder)| holder.is_none())
            .map(|(gpu, _)| gpu.model.clone())
            .collect()
    }

    /// Takes `count` free GPUs of `model` (any: `None`) for `job_id`, lowest numbers first;
    /// `None` when too few are free (nothing is taken then). A job that holds GPUs already
    /// (taken again after a restart) keeps them.
    pub fn take(&self, job_id: &str, count: u32, model: Option<&str>) -> Option<Held> {
        let mut held = self.held.lock().expect("lock");
        let mine: Vec<usize> = (0..self.gpus.len()).filter(|i| held[*i].as_deref() == Some(job_id)).collect();
        if !mine.is_empty() {
            return Some(self.held_of(&mine));
        }
        let free: Vec<usize> = (0..self.gpus.len())
            .filter(|i| held[*i].is_none() && model.is_none_or(|m| model_matches(&self.gpus[*i].model, m)))
            .take(count as usize)
            .collect();
        if free.len() < count as usize || count == 0 {
            return None;
        }
        for i in &free {
            held[*i] = Some(job_id.to_string());
        }
        Some(self.held_of(&free))
    }

    /// Takes again the GPUs numbered `minors` for a job adopted after a restart.
    pub fn retake(&self, job_id: &str, minors: &[u32]) -> Option<Held> {
        let mut held = self.held.lock().expect("lock");
        let indexes: Vec<usize> = (0..self.gpus.len()).filter(|i| minors.contains(&self.gpus[*i].minor)).collect();
        if indexes.len() != minors.len() || indexes.iter().any(|i| held[*i].as_deref().is_some_and(|h| h != job_id)) {
            return None;
        }
        for i in &indexes {
            held[*i] = Some(job_id.to_string());
        }
        Some(self.held_of(&indexes))
    }

    /// Gives back what `job_id` holds.
    pub fn release(&self, job_id: &str) {
        for holder in self.held.lock().expect("lock").iter_mut() {
            if holder.as_deref() == Some(job_id) {
                *holder = None;
            }
        }
    }

    fn held_of(&self, indexes: &[usize]) -> Held {
        let gpus: Vec<Gpu> = indexes.iter().map(|i| self.gpus[*i].clone()).collect();
        let mut devices: Vec<PathBuf> = SHARED_DEVICES.iter().map(|name| self.device_dir.join(name)).collect();
        devices.extend(gpus.iter().map(|gpu| self.device_dir.join(format!("nvidia{}", gpu.minor))));
        let mut readable = vec![self.driver_dir.clone()];
        readable.extend(DRIVER_READ.iter().map(PathBuf::from).filter(|path| path != &self.driver_dir));
        Held { gpus, devices, readable }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: &str = "Model: \t\t NVIDIA H200\nIRQ:             58\nGPU UUID: \t GPU-1a2b\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDevice Minor: \t 1\n";

    /// Stand-in device files and driver information for `models` (GPU i is `nvidia<i>`).
    pub(crate) fn stand_in(dir: &Path, models: &[&str]) {
        let dev = dir.join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        for name in SHARED_DEVICES.iter().copied().chain(["nvidia-modeset"]) {
            std::fs::write(dev.join(name), "").unwrap();
        }
        for (i, model) in models.iter().enumerate() {
            std::fs::write(dev.join(format!("nvidia{i}")), "").unwrap();
            let bus = dir.join(format!("driver/gpus/0000:0{i}:00.0"));
            std::fs::create_dir_all(&bus).unwrap();
            std::fs::write(
                bus.join("information"),
                format!("Model: {model}\nGPU UUID: GPU-{i}{i}{i}\nDevice Minor: {i}\n"),
            )
            .unwrap();
        }
    }

    fn args(dir: &Path, gpus: &str) -> GpuArgs {
        GpuArgs { device_dir: dir.join("dev"), driver_dir: dir.join("driver"), gpus: gpus.into() }
    }

    #[test]
    fn the_drivers_information_names_minor_model_and_uuid() {
        assert_eq!(parse_information(H200), Some((1, "NVIDIA H200".into(), Some("GPU-1a2b".into()))));
        assert_eq!(parse_information("Model: X\n"), None, "no minor number");
    }

    #[test]
    fn gpus_are_found_from_the_device_files_and_described_by_the_driver() {
        let dir = tempfile::tempdir().unwrap();
        stand_in(dir.path(), &["NVIDIA H200", "NVIDIA L40S"]);
        std::fs::write(dir.path().join("dev/nvidia7"), "").unwrap();
        let found = discover(&dir.path().join("dev"), &dir.path().join("driver"));
        let summary: Vec<(u32, &str)> = found.iter().map(|g| (g.minor, g.model.as_str())).collect();
        assert_eq!(summary, [(0, "NVIDIA H200"), (1, "NVIDIA L40S"), (7, "unknown")]);
        assert_eq!(found[0].uuid.as_deref(), Some("GPU-000"));
        assert!(discover(&dir.path().join("missing"), &dir.path().join("driver")).is_empty());

        let pool = args(dir.path(), "all").pool().unwrap();
        assert_eq!(pool.count(), 3);
        assert!(pool.describe().contains("nvidia1 NVIDIA L40S"), "{}", pool.describe());
        assert_eq!(args(dir.path(), "none").pool().unwrap().count(), 0);
        assert_eq!(args(dir.path(), "1").pool().unwrap().free_models(), ["NVIDIA L40S"]);
        assert!(args(dir.path(), "3").pool().unwrap_err().contains("no GPU 3"));
        assert!(args(dir.path(), "x").pool().unwrap_err().contains("not a device number"));
    }

    #[test]
    fn profile_models_match_the_drivers_names() {
        assert!(model_matches("NVIDIA A100-PCIE-40GB", "a100p"));
        assert!(model_matches("NVIDIA A100-SXM4-80GB", "a100"));
        assert!(!model_matches("NVIDIA A100-SXM4-80GB", "a100p"));
        assert!(model_matches("NVIDIA L40S", "l40s"));
        assert!(model_matches("NVIDIA H200", "h200"));
        assert!(!model_matches("NVIDIA H200", "l40s"));
        assert!(!model_matches("NVIDIA H200", ""));
    }

    #[test]
    fn jobs_hold_distinct_gpus_and_give_them_back() {
        let dir = tempfile::tempdir().unwrap();
        stand_in(dir.path(), &["NVIDIA H200", "NVIDIA H200", "NVIDIA L40S"]);
        let pool = args(dir.path(), "all").pool().unwrap();
        let a = pool.take("a", 1, None).unwrap();
        let b = pool.take("b", 1, Some("h200")).unwrap();
        assert_eq!((a.gpus[0].minor, b.gpus[0].minor), (0, 1), "none shared");
        assert_eq!(pool.take("a", 1, None).unwrap(), a, "a job holding GPUs keeps them");
        assert!(pool.take("c", 1, Some("h200")).is_none(), "no H200 left");
        assert!(pool.take("c", 2, None).is_none(), "one GPU left, two asked: nothing taken");
        assert_eq!(pool.free_models(), ["NVIDIA L40S"]);
        let c = pool.take("c", 1, None).unwrap();
        assert_eq!(c.gpus[0].minor, 2);
        assert!(
            c.devices.contains(&dir.path().join("dev/nvidia2")) && !c.devices.contains(&dir.path().join("dev/nvidia0"))
        );
        assert!(
            c.devices.contains(&dir.path().join("dev/nvidiactl"))
                && c.devices.contains(&dir.path().join("dev/nvidia-uvm"))
        );
        assert!(c.readable.contains(&dir.path().join("driver")) && c.readable.contains(&PathBuf::from("/sys")));
        assert_eq!(c.environment()[0], ("CUDA_VISIBLE_DEVICES".to_string(), "GPU-222".to_string()));
        pool.release("a");
        assert_eq!(pool.free_models(), ["NVIDIA H200"]);
        assert!(pool.retake("d", &[1]).is_none(), "held by b");
        pool.release("b");
        let d = pool.retake("d", &[0, 1]).unwrap();
        assert_eq!(d.gpus.len(), 2);
        assert!(pool.free_models().is_empty());
    }

    #[test]
    fn without_uuids_gpus_are_named_by_number_in_bus_order() {
        let held = Held {
            gpus: vec![Gpu { minor: 3, model: "unknown".into(), uuid: None }],
            devices: vec![],
            readable: vec![],
        };
        let env = held.environment();
        assert!(env.contains(&("CUDA_VISIBLE_DEVICES".into(), "3".into())));
        assert!(env.contains(&("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into())));
    }

    #[test]
    fn a_machine_without_the_gpus_asked_for_says_what_it_has() {
        assert!(GpuPool::empty().check(1, None).unwrap_err().contains("this machine has no GPU"));
        let dir = tempfile::tempdir().unwrap();
        stand_in(dir.path(), &["NVIDIA H200"]);
        let pool = args(dir.path(), "all").pool().unwrap();
        assert_eq!(pool.check(1, Some("h200")), Ok(()));
        let wrong = pool.check(1, Some("l40s")).unwrap_err();
        assert!(wrong.contains("model 'l40s'") && wrong.contains("NVIDIA H200"), "{wrong}");
        assert!(pool.check(2, None).unwrap_err().contains("2 GPU(s)"));
    }
}
