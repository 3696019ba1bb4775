// What the calls of nftables_addon share between its files: the session of the calling addon
// instance, the string arguments, and the element calls (nft_element_calls.cc, built with libnftnl
// and libmnl only).

#ifndef IPVS_NODE_CONTROLLER_NFT_CALLS_H_
#define IPVS_NODE_CONTROLLER_NFT_CALLS_H_

#include <napi.h>

#include <cstddef>
#include <string>

#include "nft_session.h"

namespace nft_addon {

// Workers hold the session too, so it outlives an environment torn down while they run.
SharedSession SessionOf(Napi::Env env);

// Argument `index`, which must be a string (a TypeError names it otherwise).
std::string StringArgument(const Napi::CallbackInfo& info, size_t index, const char* name);

#ifdef NFT_ELEMENT_BATCH
Napi::Value WriteElements(const Napi::CallbackInfo& info);
Napi::Value ReadSets(const Napi::CallbackInfo& info);
#endif

}  // namespace nft_addon

#endif  // IPVS_NODE_CONTROLLER_NFT_CALLS_H_
