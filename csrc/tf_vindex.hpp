// The vector index of the knowledge stores: USearch's HNSW (index_dense, cosine distance,
// f32) behind a small C++ interface that Cython wraps (tryll_fast/knowledge/_vindex.pyx).
//
// Why not the `usearch` Python package: its search takes no predicate, so a metadata
// filter could only drop hits after the search, and a selective filter would then return
// fewer than top_k records. Here the filter is a byte per key (1 = the record may be
// returned) consulted by the graph search itself (index_dense::filtered_search), so the
// search walks past filtered-out records and still fills top_k. Keys are row numbers
// 0..n-1 of the store. Files are USearch's own format (`Index.restore` reads them).
#pragma once

#include <usearch/index_dense.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace tf_vindex {

using namespace unum::usearch;

struct Index {
    index_dense_t index;
    std::size_t dim = 0;
    std::string error;

    // false with `error` set when USearch refuses
    bool init(std::size_t dimensions, std::size_t connectivity, std::size_t expansion_add,
              std::size_t expansion_search) {
        dim = dimensions;
        metric_punned_t metric(dimensions, metric_kind_t::cos_k, scalar_kind_t::f32_k);
        index_dense_config_t config(connectivity, expansion_add, expansion_search);
        auto made = index_dense_t::make(metric, config);
        if (!made) {
            error = made.error.what();
            made.error.release();
            return false;
        }
        index = std::move(made.index);
        return true;
    }

    // Adds rows [0, n) of `vectors` (n x dim, C order) under keys[row], or first_key + row
    // when keys is null, spread over `threads` workers.
    bool add(std::uint64_t first_key, std::uint64_t const* keys, float const* vectors,
             std::size_t n, std::size_t threads) {
        if (threads < 1) threads = 1;
        if (!index.try_reserve(index_limits_t(index.size() + n, threads))) {
            error = "out of memory reserving the index";
            return false;
        }
        std::vector<std::string> errors(threads);
        auto work = [&](std::size_t worker) {
            for (std::size_t row = worker; row < n; row += threads) {
                auto key = keys ? keys[row] : first_key + row;
                auto added = index.add(key, vectors + row * dim, worker);
                if (!added) {
                    errors[worker] = added.error.what();
                    added.error.release();
                    return;
                }
            }
        };
        if (threads == 1) {
            work(0);
        } else {
            std::vector<std::thread> pool;
            for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(work, t);
            for (auto& t : pool) t.join();
        }
        for (auto& e : errors)
            if (!e.empty()) {
                error = e;
                return false;
            }
        return true;
    }

    // Up to `wanted` nearest keys, best first; `allow` (nullable, `allow_len` bytes indexed
    // by key) restricts the candidates during the graph walk. Returns how many were found.
    std::size_t search(float const* query, std::size_t wanted, std::uint8_t const* allow,
                       std::size_t allow_len, std::uint64_t* keys, float* distances) {
        if (allow) {
            auto predicate = [allow, allow_len](index_dense_t::vector_key_t key) noexcept {
                return key < allow_len && allow[key] != 0;
            };
            return finish(index.filtered_search(query, wanted, predicate), keys, distances);
        }
        return finish(index.search(query, wanted), keys, distances);
    }

    std::size_t finish(index_dense_t::search_result_t found, std::uint64_t* keys,
                       float* distances) {
        if (!found) {
            error = found.error.what();
            found.error.release();
            return SIZE_MAX;
        }
        return found.dump_to(keys, distances);
    }

    bool save(char const* path) {
        auto saved = index.save(path);
        if (!saved) {
            error = saved.error.what();
            saved.error.release();
            return false;
        }
        return true;
    }

    bool load(char const* path) {
        auto loaded = index.load(path);
        if (!loaded) {
            error = loaded.error.what();
            loaded.error.release();
            return false;
        }
        dim = index.dimensions();
        return true;
    }

    // The stored vector of `key` into `out` (dim floats); false when the key is absent.
    bool get(std::uint64_t key, float* out) const { return index.get(key, out) == 1; }

    std::size_t size() const { return index.size(); }
    std::size_t expansion_search() const { return index.expansion_search(); }
    void set_expansion_search(std::size_t n) { index.change_expansion_search(n); }
    std::size_t memory() const { return index.memory_usage(); }
    bool is_cosine() const { return index.metric().metric_kind() == metric_kind_t::cos_k; }
    bool is_f32() const { return index.scalar_kind() == scalar_kind_t::f32_k; }
};

}  // namespace tf_vindex
