//! The embedding example (`examples/embed.rs`) runs, and its middlebox app stamped the
//! request that reached the backend: the example stays true to the API.

#[path = "../examples/embed.rs"]
mod example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_fetches_through_its_middlebox() {
    let page = example::run().await.unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(
        page.contains("GET / HTTP/1.1\r\nX-Seen-By: mb.test\r\nHost: server.test\r\n"),
        "{page}"
    );
}
