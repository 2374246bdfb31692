//! `mbx-testbed-echo serve ADDR` echoes every TCP connection (prints `listening ADDR` once bound);
//! `mbx-testbed-echo send ADDR MESSAGE` sends MESSAGE, half-closes and prints the reply.
//! Used to prove connectivity between network namespaces, where only child processes can run.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("serve"), Some(addr)) => serve(addr),
        (Some("send"), Some(addr)) => send(addr, args.get(3).map(String::as_str).unwrap_or("")),
        _ => Err("usage: mbx-testbed-echo serve ADDR | send ADDR MESSAGE".into()),
    };
    if let Err(e) = result {
        eprintln!("mbx-testbed-echo: {e}");
        std::process::exit(1);
    }
}

fn serve(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(addr)?;
    println!("listening {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let mut stream = stream?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let Some(data) = buf.get(..n) else { return };
                        if stream.write_all(data).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    Ok(())
}

fn send(addr: &str, message: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.write_all(message.as_bytes())?;
    stream.shutdown(Shutdown::Write)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    std::io::stdout().write_all(&reply)?;
    Ok(())
}
