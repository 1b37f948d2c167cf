// Hugging Face Hub model names: `--model_name_or_path bert-base-uncased` (or `org/name`) resolved
// to a local directory through the cache that huggingface_hub keeps, downloading into it when the
// model is not there yet, so that Python's transformers finds what anatomy fetched and vice versa.
//
// Note [hub cache layout] (as huggingface_hub writes it):
//   <cache>/models--<org>--<name>/
//     refs/<revision>                   text file: the commit hash that revision (e.g. main) names
//     blobs/<etag>                      file contents; etag = sha256 for LFS files, git blob sha1 else
//     blobs/<etag>.incomplete           a download in progress (resumed with an HTTP Range request)
//     snapshots/<commit>/<filename>     relative symlink to ../../blobs/<etag>
//     .no_exist/<commit>/<filename>     empty: the Hub has no such file at that commit
//   <cache>/.locks/models--<org>--<name>/<etag>.lock   flock(2)ed while that blob is written
// <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub.
#pragma once
#include <string>
#include <vector>

namespace anatomy {

// Everything resolution depends on from the environment, gathered once (tests build their own).
struct HubSettings {
  std::string cache_dir;                           // the <cache> above
  std::string endpoint = "https://huggingface.co";  // $HF_ENDPOINT, no trailing '/'
  std::string token;                               // $HF_TOKEN, else the stored token file
  bool offline = false;                            // $HF_HUB_OFFLINE (or $TRANSFORMERS_OFFLINE)
  std::string offline_variable = "HF_HUB_OFFLINE";  // the one that was set, for errors
  bool progress = false;                           // a progress bar on stderr (a terminal)
};

HubSettings hub_settings_from_env();

// A local directory holding config.json, model.safetensors and the model's tokenizer files:
//  - `name_or_path` itself when it is an existing directory (returned unchanged);
//  - else, for a Hub model id (`name` or `org/name`), its snapshot in the cache for `revision`
//    (empty: "main"), downloaded first when it is not complete there and not offline.
// Failures are one-line anatomy::Errors naming the model and the command that fetches it.
std::string resolve_model(const std::string& name_or_path, const std::string& revision);
std::string resolve_model(const std::string& name_or_path, const std::string& revision,
                          const HubSettings& settings);

// Whether this build can download (it was built with libcurl).
bool hub_downloads_available();

// --- pieces, exposed for the tests ---------------------------------------------------------

// `org/name` or `name` as the Hub accepts them; anything else is not a Hub id.
bool is_hub_model_id(const std::string& s);
// <cache>/models--org--name
std::string hub_repo_dir(const HubSettings& settings, const std::string& repo_id);
// The files anatomy takes from a model repository: the weights and config it loads and every
// tokenizer file transformers' AutoTokenizer may read.
const std::vector<std::string>& hub_wanted_files();

}  // namespace anatomy
