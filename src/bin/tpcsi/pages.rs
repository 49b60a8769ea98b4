//! Paged listings (ListVolumes, ListSnapshots), followed to the end.

use tonic::Status;

use crate::failure::Result;

/// Follows `next_token` until it is empty; a token that comes back twice
/// is an error rather than a loop.
pub async fn all_pages<T, F, Fut>(mut page: F) -> Result<Vec<T>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String)>>,
{
    let mut all = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut token = String::new();
    loop {
        let (items, next) = page(token).await?;
        all.extend(items);
        if next.is_empty() {
            return Ok(all);
        }
        if !seen.insert(next.clone()) {
            return Err(
                Status::internal(format!("the driver sent page token {next:?} twice")).into(),
            );
        }
        token = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Failure;
    use tonic::Code;

    #[tokio::test]
    async fn pages_are_followed_and_a_repeated_token_stops() {
        let got = all_pages(|token| async move {
            Ok(match token.as_str() {
                "" => (vec![1, 2], "a".to_string()),
                "a" => (vec![3], "b".to_string()),
                _ => (vec![4], String::new()),
            })
        })
        .await
        .unwrap();
        assert_eq!(got, vec![1, 2, 3, 4]);
        let looped = all_pages(|_| async { Ok((vec![0], "same".to_string())) }).await;
        assert!(matches!(looped, Err(Failure::Grpc(s)) if s.code() == Code::Internal));
    }
}
